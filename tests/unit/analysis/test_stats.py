"""stats.py against scipy: the stored reference (tests/fixtures/analysis/mwu_reference.json) and
scipy itself on random samples."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.stats import mannwhitneyu

from controlplane.analysis.stats import (
    ASYMPTOTIC,
    EXACT,
    hodges_lehmann,
    mann_whitney_u,
    report_float,
)

REFERENCE = json.loads(
    (Path(__file__).parents[2] / "fixtures/analysis/mwu_reference.json").read_text()
)
CASES = REFERENCE["cases"]
REL = 1e-9


def _close(ours: float, theirs: float) -> bool:
    return math.isclose(ours, theirs, rel_tol=REL, abs_tol=0.0)


def test_reference_covers_both_methods_ties_and_identical_samples():
    methods = {c["method"] for c in CASES}
    assert methods == {EXACT, ASYMPTOTIC}
    assert any(c["p_value"] is None for c in CASES)
    assert any(c["p_value"] is not None and c["p_value"] < 1e-10 for c in CASES)
    assert any(len(c["x"]) != len(c["y"]) for c in CASES)
    assert len(CASES) >= 50


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_matches_scipy_reference(case):
    result = mann_whitney_u(case["x"], case["y"])
    assert result.u == case["u"]
    assert result.method == case["method"]
    if case["p_value"] is None:
        # scipy's NaN for zero variance: here identical samples are no evidence, p = 1.
        assert result.p_value == 1.0
    else:
        assert _close(result.p_value, case["p_value"]), (result.p_value, case["p_value"])


def _sample(values: st.SearchStrategy[float]) -> st.SearchStrategy[list[float]]:
    return st.lists(values, min_size=1, max_size=30)


_tied = st.integers(min_value=-3, max_value=3).map(float)
_continuous = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_subnormal=False)


@settings(max_examples=300, deadline=None)
@given(
    x=st.one_of(_sample(_tied), _sample(_continuous)),
    y=st.one_of(_sample(_tied), _sample(_continuous)),
)
def test_matches_scipy_on_random_samples(x, y):
    ours = mann_whitney_u(x, y)
    theirs = mannwhitneyu(x, y, alternative="two-sided")
    assert ours.u == float(theirs.statistic)
    if math.isnan(theirs.pvalue):
        assert ours.p_value == 1.0
        assert len(set(x + y)) == 1
    else:
        assert _close(ours.p_value, float(theirs.pvalue))


@settings(max_examples=60, deadline=None)
@given(
    x=st.lists(_continuous, min_size=1, max_size=8, unique=True),
    y=st.lists(_continuous, min_size=9, max_size=120, unique=True),
)
def test_matches_scipy_exact_with_one_long_sample(x, y):
    # The exact method with one short and one long sample: scipy's choice, and the tail sum
    # at its largest.
    assume(not set(x) & set(y))
    ours = mann_whitney_u(x, y)
    theirs = mannwhitneyu(x, y, alternative="two-sided")
    assert ours.method == EXACT
    assert _close(ours.p_value, float(theirs.pvalue))


def test_identical_values_have_p_one_not_nan():
    result = mann_whitney_u([0.0] * 50, [0.0] * 50)
    assert result.p_value == 1.0
    assert result.z is None
    assert result.u == 1250.0


def test_rejects_empty_and_non_finite_samples():
    with pytest.raises(ValueError, match="at least one value"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        mann_whitney_u([1.0, math.nan], [1.0])
    with pytest.raises(ValueError, match="finite"):
        hodges_lehmann([math.inf], [1.0])
    with pytest.raises(ValueError, match="at least one value"):
        hodges_lehmann([1.0], [])


def test_hodges_lehmann_is_the_median_of_pairwise_differences():
    assert hodges_lehmann([1.0, 2.0, 3.0], [0.0]) == 2.0
    # Pairwise differences 1-0, 1-10, 5-0, 5-10: median of (-9, -5, 1, 5) = -2.
    assert hodges_lehmann([1.0, 5.0], [0.0, 10.0]) == -2.0
    # Canary minus baseline: a canary that is higher gives a positive shift.
    assert hodges_lehmann([10.0] * 5, [7.0] * 5) == 3.0


@settings(max_examples=100, deadline=None)
@given(
    x=st.lists(_tied, min_size=1, max_size=15),
    y=st.lists(_tied, min_size=1, max_size=15),
    shift=st.integers(min_value=-5, max_value=5),
)
def test_hodges_lehmann_moves_with_a_shift_of_the_canary(x, y, shift):
    base = hodges_lehmann(x, y)
    assert base == statistics.median([a - b for a in x for b in y])
    assert hodges_lehmann([v + shift for v in x], y) == base + shift


def test_report_float_rounds_and_drops_non_finite():
    assert report_float(0.1 + 0.2) == 0.3
    assert report_float(3.5565709749847226e-21) == 3.55657e-21
    assert report_float(None) is None
    assert report_float(math.nan) is None
    assert report_float(-math.inf) is None
