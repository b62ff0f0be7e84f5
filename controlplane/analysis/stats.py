"""The two-sample statistics the judge runs on per-prompt values, in plain Python.

`mann_whitney_u` reproduces `scipy.stats.mannwhitneyu(x, y, alternative="two-sided")` with its
default `method="auto"` (scipy 1.18, `scipy/stats/_mannwhitneyu.py`), so that the verdicts can be
checked against scipy (tests/fixtures/analysis/mwu_reference.json) without the control plane
depending on scipy at runtime:

- U is x's statistic, `R1 - n1 (n1 + 1) / 2` with average ranks for ties;
- the exact null distribution is used when at least one sample has 8 values or fewer and no
  value is tied (scipy's `_mwu_choose_method`); its p-value is `2 P(U >= max(U1, U2))`, clipped
  to 1;
- otherwise the normal approximation, with scipy's tie correction of the variance and a
  continuity correction of 0.5 towards the mean.

One deliberate difference: when every value of both samples is the same, the variance is zero and
scipy returns a NaN p-value; here p is 1 — identical samples are no evidence of a difference, and
a NaN would not survive the JSON report.

`hodges_lehmann` is the effect size the judge compares with a rule's allowed effect.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

EXACT = "exact"
ASYMPTOTIC = "asymptotic"

#: scipy's threshold: above this size in both samples the normal approximation is used.
_EXACT_MAX_SMALLER_N = 8


@dataclass(frozen=True)
class MannWhitney:
    #: Mann-Whitney U of the first sample (scipy's `statistic`).
    u: float
    #: Two-sided p-value.
    p_value: float
    #: `exact` or `asymptotic`, chosen as scipy chooses.
    method: str
    n_x: int
    n_y: int
    #: The standardized statistic of the normal approximation; None for the exact method.
    z: float | None = None


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """Two-sided Mann-Whitney U test of x against y, as scipy computes it (module docstring)."""
    xs = [_finite(v) for v in x]
    ys = [_finite(v) for v in y]
    n1, n2 = len(xs), len(ys)
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples must hold at least one value")
    ranks, tie_counts = _average_ranks(xs + ys)
    r1 = math.fsum(ranks[:n1])
    u1 = r1 - n1 * (n1 + 1) / 2
    u2 = n1 * n2 - u1
    has_ties = any(t > 1 for t in tie_counts)

    if (n1 > _EXACT_MAX_SMALLER_N and n2 > _EXACT_MAX_SMALLER_N) or has_ties:
        z = _normal_z(u1, n1, n2, tie_counts)
        # Zero variance (every value equal): U sits on its mean, there is no evidence of a shift.
        p = 1.0 if z is None else min(1.0, max(0.0, 2.0 * _normal_sf(abs(z))))
        return MannWhitney(u=u1, p_value=p, method=ASYMPTOTIC, n_x=n1, n_y=n2, z=z)

    # Without ties U is an integer; the exact tail is counted from the far side by symmetry.
    u = round(max(u1, u2))
    p = 2.0 * _exact_cdf(n1 * n2 - u, n1, n2)
    return MannWhitney(u=u1, p_value=min(1.0, max(0.0, p)), method=EXACT, n_x=n1, n_y=n2)


def hodges_lehmann(x_canary: Sequence[float], y_baseline: Sequence[float]) -> float:
    """The Hodges-Lehmann shift: the median of all pairwise differences canary - baseline.

    Robust to outliers and in the metric's own units, which is why rules state their allowed
    effect with it. Both samples must be non-empty.
    """
    xs = [_finite(v) for v in x_canary]
    ys = [_finite(v) for v in y_baseline]
    if not xs or not ys:
        raise ValueError("both samples must hold at least one value")
    return float(statistics.median(a - b for a in xs for b in ys))


def _finite(value: float) -> float:
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"samples must hold finite numbers, got {value!r}")
    return v


def _average_ranks(values: list[float]) -> tuple[list[float], list[int]]:
    """1-based ranks, tied values given the mean of the ranks they span; and the count of each
    distinct value (scipy's tie counts `t`)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        rank = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = rank
        i = j + 1
    return ranks, list(Counter(values).values())


def _normal_z(u1: float, n1: int, n2: int, tie_counts: list[int]) -> float | None:
    """scipy's `_get_mwu_z` with continuity correction, in its order of operations."""
    mu = n1 * n2 / 2
    n = n1 + n2
    tie_term = float(sum(t**3 - t for t in tie_counts))
    s = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
    numerator = u1 - mu
    numerator -= 0.5 * _sign(numerator)
    if s == 0.0:
        return None
    return numerator / s


def _sign(v: float) -> float:
    return (v > 0) - (v < 0)


def _normal_sf(z: float) -> float:
    """Upper tail of the standard normal, accurate far into the tail (erfc, not 1 - cdf)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _exact_cdf(k: int, n1: int, n2: int) -> float:
    """P(U <= k) under the null for samples of n1 and n2 values without ties.

    The number of arrangements with U = u is the coefficient of q**u in the Gaussian binomial
    [n1 + n2 choose n1]_q = prod_{i=1..m} (1 - q**(n+i)) / (1 - q**i) with m = min(n1, n2),
    n = max(n1, n2); computed in exact integers up to degree k, so O(m k) even for a long
    second sample (the exact method only runs when m <= 8).
    """
    if k < 0:
        return 0.0
    m, n = min(n1, n2), max(n1, n2)
    coeffs = [0] * (k + 1)
    coeffs[0] = 1
    for i in range(1, m + 1):
        # Multiply by (1 - q**(n+i)): highest degree first so each term reads the old value.
        step = n + i
        for d in range(k, step - 1, -1):
            coeffs[d] -= coeffs[d - step]
        # Divide by (1 - q**i): multiply by 1 + q**i + q**2i + ..., a running sum with stride i.
        for d in range(i, k + 1):
            coeffs[d] += coeffs[d - i]
    # int / int is correctly rounded: the only rounding of the exact tail probability.
    return sum(coeffs) / math.comb(n1 + n2, n1)


#: Significant digits a report keeps: enough to read a p-value of 1e-12 or a shift of 0.0004
#: nats/token, few enough that a float's last-digit noise does not reach the page.
REPORT_DIGITS = 6


def report_float(value: float | None) -> float | None:
    """A value as a JSON report holds it: rounded to `REPORT_DIGITS` significant digits, and
    None for a missing, NaN or infinite value (JSON has no NaN)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{REPORT_DIGITS}g}")
