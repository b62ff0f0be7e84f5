"""Per-prompt metric values of both cohorts, computed from their observations.

Each metric gives one value per prompt and cohort, in the order of the prompts' indexes (the
union of both cohorts' prompts, so the two lists line up). None means "not observed" — the
request failed, the path returned no such field, or the metric is undefined for that reply — and
the judge leaves it out; it never stands for zero. A prompt sent to several workers of one cohort
gets the mean of their values.

The metrics (`METRICS`, the catalog in `analysis/catalog.py`):

- drift: `ref_logprob`, the mean teacher-forced log probability of the template's reference
  continuation; `kl_estimate`, a per-prompt estimate of KL(baseline || cohort) on the same tokens
  (`_kl_estimate` says which estimator and how it is biased). Both are None everywhere when the
  path returns no prompt logprobs (`continuation_logprobs` is None), so the judge reports the
  metric as without data instead of passing it.
- output: `zero_tokens`, `non_terminal`, `bad_logprobs` (1 or 0), `distinct_2`, `length_ratio`.
- serving: `error` (1 or 0), `ttft_ms`, `total_ms` (None for a failed request).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import TypedDict

from controlplane.analysis.catalog import CATALOG, MetricInfo
from controlplane.analysis.stats import report_float
from controlplane.dynamo.observation import Observation

#: Every metric by name, with its unit, group and default direction.
METRICS: dict[str, MetricInfo] = CATALOG

#: Metric name -> one value per prompt (None: not observed).
Values = dict[str, list[float | None]]

#: Finish reasons of a reply that ended as a reply should: `nvext.detailed_finish_reason`
#: (DYNAMO_CONTRACT: eos, stop, length, cancelled, ...) or the plain `finish_reason`.
TERMINAL_FINISHES = frozenset({"eos", "stop", "length"})


def per_prompt_values(
    baseline: Sequence[Observation], canary: Sequence[Observation], *, max_tokens: int
) -> tuple[Values, Values]:
    """(baseline values, canary values), one list per metric, one entry per prompt."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    prompts = _prompts(baseline, canary)
    base_by, canary_by = _by_prompt(baseline), _by_prompt(canary)
    base_values: Values = {name: [] for name in METRICS}
    canary_values: Values = {name: [] for name in METRICS}
    for prompt in prompts:
        base_obs, canary_obs = base_by.get(prompt, []), canary_by.get(prompt, [])
        for name, compute in _PER_REPLY.items():
            base_values[name].append(_mean(compute(o, max_tokens) for o in base_obs))
            canary_values[name].append(_mean(compute(o, max_tokens) for o in canary_obs))
        reference = _reference_logprobs(base_obs)
        # The baseline against itself: no divergence wherever it was observed.
        base_values["kl_estimate"].append(0.0 if any(v is not None for v in reference) else None)
        canary_values["kl_estimate"].append(_mean(_kl_estimate(reference, o) for o in canary_obs))
    return base_values, canary_values


class MovedPrompt(TypedDict):
    prompt_index: int
    #: Canary minus baseline `ref_logprob` (nats/token); None without prompt logprobs.
    ref_logprob_shift: float | None
    #: The canary's `kl_estimate` for this prompt; None without prompt logprobs.
    kl_estimate: float | None
    #: 1 - (common prefix of the two greedy replies) / (the longer reply): 0 identical, 1 apart
    #: from the first token (or one cohort failed).
    output_divergence: float
    baseline_ids: list[int]
    canary_ids: list[int]
    baseline_finish: str | None
    canary_finish: str | None
    baseline_error: str | None
    canary_error: str | None


def moved_most(
    baseline_obs: Sequence[Observation], canary_obs: Sequence[Observation], k: int
) -> list[MovedPrompt]:
    """The k prompts that moved most between the cohorts, for the report: ranked by the shift of
    the reference continuation's log probability where prompt logprobs exist (drift is what the
    analysis is about), then by how far the greedy replies diverge. Prompts present in only one
    cohort are left out: there is nothing to compare."""
    if k <= 0:
        return []
    base_by, canary_by = _by_prompt(baseline_obs), _by_prompt(canary_obs)
    moved: list[MovedPrompt] = []
    for prompt in sorted(base_by.keys() & canary_by.keys()):
        base, cand = base_by[prompt], canary_by[prompt]
        shift = _difference(
            _mean(_ref_logprob(o, 1) for o in cand), _mean(_ref_logprob(o, 1) for o in base)
        )
        first_base, first_canary = base[0], cand[0]
        moved.append(
            MovedPrompt(
                prompt_index=prompt,
                ref_logprob_shift=shift,
                kl_estimate=_mean(_kl_estimate(_reference_logprobs(base), o) for o in cand),
                output_divergence=_divergence(first_base, first_canary),
                baseline_ids=list(first_base.completion_ids),
                canary_ids=list(first_canary.completion_ids),
                baseline_finish=first_base.finish_reason,
                canary_finish=first_canary.finish_reason,
                baseline_error=first_base.error,
                canary_error=first_canary.error,
            )
        )
    moved.sort(
        key=lambda m: (
            m["ref_logprob_shift"] is not None,
            abs(m["ref_logprob_shift"] or 0.0),
            m["output_divergence"],
        ),
        reverse=True,
    )
    for m in moved[:k]:
        m["ref_logprob_shift"] = report_float(m["ref_logprob_shift"])
        m["kl_estimate"] = report_float(m["kl_estimate"])
        m["output_divergence"] = report_float(m["output_divergence"]) or 0.0
    return moved[:k]


def _prompts(*cohorts: Sequence[Observation]) -> list[int]:
    return sorted({o.prompt_index for cohort in cohorts for o in cohort})


def _by_prompt(observations: Sequence[Observation]) -> dict[int, list[Observation]]:
    by: dict[int, list[Observation]] = defaultdict(list)
    for o in observations:
        by[o.prompt_index].append(o)
    return by


def _mean(values: Iterable[float | None]) -> float | None:
    observed = [v for v in values if v is not None]
    return math.fsum(observed) / len(observed) if observed else None


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _usable(logprob: float | None) -> bool:
    return logprob is not None and math.isfinite(logprob)


# Drift ------------------------------------------------------------------------------------


def _ref_logprob(o: Observation, max_tokens: int) -> float | None:
    if o.error is not None or o.continuation_logprobs is None:
        return None
    # Tokens without a usable logprob are skipped; `kl_estimate` pairs tokens across cohorts,
    # so a hole on one side does not shift it.
    return _mean(lp for lp in o.continuation_logprobs if _usable(lp))


def _reference_logprobs(baseline: Sequence[Observation]) -> list[float | None]:
    """The baseline's log probability of each reference token (mean over its workers), None
    where no baseline worker gave a usable one. Empty without any."""
    columns: list[list[float]] = []
    for o in baseline:
        if o.error is not None or o.continuation_logprobs is None:
            continue
        for i, lp in enumerate(o.continuation_logprobs):
            if i == len(columns):
                columns.append([])
            if _usable(lp):
                columns[i].append(lp)  # type: ignore[arg-type]
    return [math.fsum(c) / len(c) if c else None for c in columns]


def _kl_estimate(reference: Sequence[float | None], o: Observation) -> float | None:
    """mean over the reference tokens of log p_baseline(token) - log p_cohort(token).

    This is the "k1" Monte Carlo estimator of KL(baseline || cohort) restricted to the chosen
    tokens. It is unbiased only when the tokens are sampled from the baseline policy; here they are
    the template's fixed reference continuation, so it estimates how much less likely the cohort
    finds the reference than the baseline does — biased towards the reference's tokens, not a true
    divergence, and a single prompt's value can be negative (the canary likes the reference
    better). Its virtue is that it needs only the chosen tokens' log probabilities, which prompt
    logprobs give; the judge compares its distribution over prompts, not one value.
    """
    if o.error is not None or o.continuation_logprobs is None:
        return None
    gaps = [
        base - lp  # type: ignore[operator]
        for base, lp in zip(reference, o.continuation_logprobs, strict=False)
        if _usable(base) and _usable(lp)
    ]
    return math.fsum(gaps) / len(gaps) if gaps else None


# Output and serving -----------------------------------------------------------------------


def _replied(o: Observation) -> bool:
    return o.error is None


def _zero_tokens(o: Observation, max_tokens: int) -> float | None:
    return None if not _replied(o) else float(len(o.completion_ids) == 0)


def _non_terminal(o: Observation, max_tokens: int) -> float | None:
    # A reply without any finish reason did not say it ended properly: counted as non-terminal.
    return None if not _replied(o) else float(o.finish_reason not in TERMINAL_FINISHES)


def _bad_logprobs(o: Observation, max_tokens: int) -> float | None:
    if not _replied(o):
        return None
    if not o.completion_ids:
        # Nothing generated, nothing to score: `zero_tokens` already counts this reply.
        return 0.0
    # Absent (fewer logprobs than tokens, or none at all), None, NaN or infinite.
    absent = len(o.completion_logprobs) < len(o.completion_ids)
    return float(absent or not all(_usable(lp) for lp in o.completion_logprobs))


def _distinct_2(o: Observation, max_tokens: int) -> float | None:
    ids = o.completion_ids
    if not _replied(o) or len(ids) < 2:
        return None  # no bigram: repetition is undefined, not perfect
    bigrams = list(itertools.pairwise(ids))
    return len(set(bigrams)) / len(bigrams)


def _length_ratio(o: Observation, max_tokens: int) -> float | None:
    return None if not _replied(o) else len(o.completion_ids) / max_tokens


def _error(o: Observation, max_tokens: int) -> float | None:
    return float(not _replied(o))


def _ttft_ms(o: Observation, max_tokens: int) -> float | None:
    return _latency(o, o.ttft_ms)


def _total_ms(o: Observation, max_tokens: int) -> float | None:
    return _latency(o, o.total_ms)


def _latency(o: Observation, ms: float | None) -> float | None:
    # A failed request's latency measures the failure, not serving: left out.
    return ms if _replied(o) and ms is not None and math.isfinite(ms) else None


def _divergence(base: Observation, canary: Observation) -> float:
    if not _replied(base) or not _replied(canary):
        return 0.0 if _replied(base) == _replied(canary) else 1.0
    a, b = base.completion_ids, canary.completion_ids
    longer = max(len(a), len(b))
    if longer == 0:
        return 0.0
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return 1.0 - common / longer


#: Metrics read from one reply on its own (kl_estimate also needs the baseline's reply).
_PER_REPLY: dict[str, Callable[[Observation, int], float | None]] = {
    "ref_logprob": _ref_logprob,
    "zero_tokens": _zero_tokens,
    "non_terminal": _non_terminal,
    "bad_logprobs": _bad_logprobs,
    "distinct_2": _distinct_2,
    "length_ratio": _length_ratio,
    "error": _error,
    "ttft_ms": _ttft_ms,
    "total_ms": _total_ms,
}
