"""The judge: per-metric verdicts on per-prompt values, a weighted score and one outcome.

Per metric (a `MetricRule`), the usable values (not None, finite) of each cohort:

- fewer than `min_samples` in either cohort: `nodata`;
- otherwise a two-sided Mann-Whitney U test (`stats.mann_whitney_u`, canary against baseline)
  and the Hodges-Lehmann shift canary - baseline as the effect. The metric `fail`s when the
  difference is significant (p < alpha) AND the shift goes beyond `allowed_effect` in the bad
  direction (`increase`: shift > allowed; `decrease`: shift < -allowed; `either`: |shift| >
  allowed). A shift equal to the allowance, up to float rounding, passes. Otherwise `pass`.

Score (0-100): in each group, the share of its counted metrics that passed; the groups' shares
averaged with the spec's group weights (a group without a weight weighs the mean of the named
weights, or 1). A `nodata` metric is left out of the score — too little data is no evidence
either way — unless it is `must_have_data`, when it counts as not passed, so the score shown next
to an inconclusive outcome does not look complete. Groups with nothing counted are left out.

Outcome, first match wins:

1. `fail`: a critical metric failed (a measured failure stands whatever else is missing);
2. `inconclusive`: a `must_have_data` metric has no data, or no metric could be judged;
3. `fail`: the score is below `marginal_score`;
4. `marginal`: the score is below `pass_score`;
5. `pass`.

Missing required data comes before the score on purpose: the issue's "missing data where a
metric must have data" holds for a person rather than rolling back on an incomplete score.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import TypedDict

from controlplane.analysis.rules import (
    DECREASE,
    DIRECTIONS,
    EITHER,
    INCREASE,
    JudgeSpec,
    MetricRule,
)
from controlplane.analysis.stats import hodges_lehmann, mann_whitney_u, report_float

PASS = "pass"
FAIL = "fail"
NODATA = "nodata"
MARGINAL = "marginal"
INCONCLUSIVE = "inconclusive"
OUTCOMES = (PASS, MARGINAL, INCONCLUSIVE, FAIL)

#: The score is compared with the thresholds at this many decimals, so that a weighted mean
#: meant to be exactly 95 is not 94.99999999999999 by float accident.
_SCORE_DECIMALS = 9


class MetricVerdict(TypedDict):
    name: str
    group: str
    direction: str
    allowed_effect: float
    critical: bool
    must_have_data: bool
    #: `pass`, `fail` or `nodata`.
    verdict: str
    #: Why, in one short clause.
    reason: str
    #: Usable per-prompt values in each cohort.
    n_baseline: int
    n_canary: int
    median_baseline: float | None
    median_canary: float | None
    #: Mann-Whitney U of the canary sample, its two-sided p-value and method; None for nodata.
    u: float | None
    p_value: float | None
    method: str | None
    #: Hodges-Lehmann shift canary - baseline, in the metric's units; None for nodata.
    effect: float | None


class GroupScore(TypedDict):
    group: str
    weight: float
    #: Metrics that count in the score (judged, or must-have without data) and those passed.
    counted: int
    passed: int
    #: passed / counted; None when nothing counted (the group is left out of the score).
    share: float | None


class JudgeReport(TypedDict):
    #: `pass`, `marginal`, `inconclusive` or `fail`.
    outcome: str
    #: The reason for the outcome, one sentence.
    summary: str
    #: 0-100; None when no metric could be judged.
    score: float | None
    pass_score: float
    marginal_score: float
    alpha: float
    min_samples: int
    metrics: list[MetricVerdict]
    groups: list[GroupScore]


def judge(
    spec: JudgeSpec,
    baseline_values: Mapping[str, Sequence[float | None]],
    canary_values: Mapping[str, Sequence[float | None]],
) -> JudgeReport:
    """Judge the canary cohort against the baseline on every metric of the spec.

    `baseline_values` / `canary_values` map a metric name to its per-prompt values
    (`metrics.per_prompt_values`); a metric missing from them has no data.
    """
    _validate(spec)
    verdicts = [
        _judge_metric(
            spec, rule, baseline_values.get(rule.name, ()), canary_values.get(rule.name, ())
        )
        for rule in spec.metrics
    ]
    groups = _group_scores(spec, verdicts)
    score = _score(groups)
    outcome, summary = _outcome(spec, verdicts, score)
    return JudgeReport(
        outcome=outcome,
        summary=summary,
        score=report_float(score),
        pass_score=float(spec.pass_score),
        marginal_score=float(spec.marginal_score),
        alpha=float(spec.alpha),
        min_samples=spec.min_samples,
        metrics=[_rounded(v) for v in verdicts],
        groups=[
            GroupScore(
                group=g["group"],
                weight=g["weight"],
                counted=g["counted"],
                passed=g["passed"],
                share=report_float(g["share"]),
            )
            for g in groups
        ],
    )


def _validate(spec: JudgeSpec) -> None:
    """The spec parser refuses these already; a spec built by hand gets the same clear error."""
    if not 0.0 < spec.alpha < 1.0:
        raise ValueError(f"alpha must be between 0 and 1, got {spec.alpha}")
    if spec.min_samples < 1:
        raise ValueError(f"min_samples must be at least 1, got {spec.min_samples}")
    if not 0.0 <= spec.marginal_score <= spec.pass_score <= 100.0:
        raise ValueError(
            "scores must satisfy 0 <= marginal_score <= pass_score <= 100, got "
            f"{spec.marginal_score} and {spec.pass_score}"
        )
    for group, weight in spec.group_weights.items():
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(f"group {group!r} has weight {weight}; weights are finite and >= 0")
    names = [rule.name for rule in spec.metrics]
    if len(names) != len(set(names)):
        raise ValueError(f"a metric is named twice in {names}")
    for rule in spec.metrics:
        if rule.direction not in DIRECTIONS:
            raise ValueError(f"{rule.name}: direction {rule.direction!r} is not in {DIRECTIONS}")
        if not (math.isfinite(rule.allowed_effect) and rule.allowed_effect >= 0.0):
            raise ValueError(f"{rule.name}: allowed_effect must be finite and >= 0")


def _usable(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _judge_metric(
    spec: JudgeSpec,
    rule: MetricRule,
    baseline: Sequence[float | None],
    canary: Sequence[float | None],
) -> MetricVerdict:
    base, cand = _usable(baseline), _usable(canary)
    verdict = MetricVerdict(
        name=rule.name,
        group=rule.group,
        direction=rule.direction,
        allowed_effect=float(rule.allowed_effect),
        critical=rule.critical,
        must_have_data=rule.must_have_data,
        verdict=NODATA,
        reason="",
        n_baseline=len(base),
        n_canary=len(cand),
        median_baseline=statistics.median(base) if base else None,
        median_canary=statistics.median(cand) if cand else None,
        u=None,
        p_value=None,
        method=None,
        effect=None,
    )
    if len(base) < spec.min_samples or len(cand) < spec.min_samples:
        verdict["reason"] = (
            f"fewer than {spec.min_samples} usable values "
            f"(baseline {len(base)}, canary {len(cand)})"
        )
        return verdict
    test = mann_whitney_u(cand, base)
    effect = hodges_lehmann(cand, base)
    verdict["u"], verdict["p_value"] = test.u, test.p_value
    verdict["method"], verdict["effect"] = test.method, effect
    significant = test.p_value < spec.alpha
    beyond = _beyond_allowed(rule, effect)
    p_text = f"p={_fmt(test.p_value)}"
    shift = f"shift {_signed(effect)}"
    if significant and beyond:
        verdict["verdict"] = FAIL
        verdict["reason"] = (
            f"significant ({p_text} < {_fmt(spec.alpha)}) and the {shift} is beyond the "
            f"allowed {_fmt(rule.allowed_effect)} ({rule.direction})"
        )
    elif significant:
        verdict["verdict"] = PASS
        verdict["reason"] = (
            f"significant ({p_text}) but the {shift} is within the allowed "
            f"{_fmt(rule.allowed_effect)} ({rule.direction})"
        )
    else:
        verdict["verdict"] = PASS
        verdict["reason"] = f"no significant difference ({p_text}, {shift})"
    return verdict


def _beyond_allowed(rule: MetricRule, effect: float) -> bool:
    bad = {INCREASE: effect, DECREASE: -effect, EITHER: abs(effect)}[rule.direction]
    allowed = rule.allowed_effect
    # A shift equal to the allowance passes, also when float subtraction lands a hair over it
    # (1.1 - 1.0 is 0.10000000000000009).
    return bad > allowed and not math.isclose(bad, allowed, rel_tol=1e-9, abs_tol=1e-12)


def _group_scores(spec: JudgeSpec, verdicts: list[MetricVerdict]) -> list[GroupScore]:
    named = list(spec.group_weights.values())
    default_weight = math.fsum(named) / len(named) if named else 1.0
    groups: dict[str, GroupScore] = {}
    for v in verdicts:
        g = groups.setdefault(
            v["group"],
            GroupScore(
                group=v["group"],
                weight=float(spec.group_weights.get(v["group"], default_weight)),
                counted=0,
                passed=0,
                share=None,
            ),
        )
        if v["verdict"] == NODATA and not v["must_have_data"]:
            continue
        g["counted"] += 1
        g["passed"] += v["verdict"] == PASS
    for g in groups.values():
        g["share"] = g["passed"] / g["counted"] if g["counted"] else None
    return list(groups.values())


def _score(groups: list[GroupScore]) -> float | None:
    weighed = [(g["weight"], g["share"]) for g in groups if g["share"] is not None]
    total = math.fsum(w for w, _ in weighed)
    if total == 0.0:
        return None
    return round(100.0 * math.fsum(w * s for w, s in weighed) / total, _SCORE_DECIMALS)


def _outcome(
    spec: JudgeSpec, verdicts: list[MetricVerdict], score: float | None
) -> tuple[str, str]:
    failed = [v for v in verdicts if v["verdict"] == FAIL]
    critical = [v for v in failed if v["critical"]]
    if critical:
        first = critical[0]
        moved = f"{first['name']} {_moved(first)} on the canary ({_failure_detail(first)})"
        if len(critical) == 1:
            return FAIL, f"Failed: critical metric {moved}."
        return FAIL, (f"Failed: critical metrics {_names(critical)} moved the bad way; {moved}.")
    missing = [v for v in verdicts if v["verdict"] == NODATA and v["must_have_data"]]
    if missing:
        return INCONCLUSIVE, (
            f"Inconclusive: {_names(missing)} must have data but had fewer than "
            f"{spec.min_samples} usable values in a cohort; a person decides."
        )
    judged = [v for v in verdicts if v["verdict"] != NODATA]
    if not judged:
        return INCONCLUSIVE, (
            f"Inconclusive: no metric had {spec.min_samples} usable values in both cohorts; "
            "a person decides."
        )
    if score is None:
        return INCONCLUSIVE, (
            "Inconclusive: every judged metric is in a group of weight 0; a person decides."
        )
    failures = f" ({_names(failed)} failed)" if failed else ""
    if score < spec.marginal_score:
        return FAIL, (
            f"Failed: score {_fmt(score)} is below the marginal score "
            f"{_fmt(spec.marginal_score)}{failures}."
        )
    if score < spec.pass_score:
        return MARGINAL, (
            f"Marginal: score {_fmt(score)} is below the pass score {_fmt(spec.pass_score)}"
            f"{failures}; a person decides."
        )
    return PASS, (
        f"Passed: score {_fmt(score)} with {len(judged)} of {len(verdicts)} metrics judged"
        + (f"{failures}." if failed else ", none failed.")
    )


def _rounded(v: MetricVerdict) -> MetricVerdict:
    """The verdict as reported: decided on full precision, shown rounded (`report_float`)."""
    out = v.copy()
    out["median_baseline"] = report_float(v["median_baseline"])
    out["median_canary"] = report_float(v["median_canary"])
    out["u"] = report_float(v["u"])
    out["p_value"] = report_float(v["p_value"])
    out["effect"] = report_float(v["effect"])
    return out


def _moved(v: MetricVerdict) -> str:
    return "rose" if (v["effect"] or 0.0) > 0 else "fell"


def _failure_detail(v: MetricVerdict) -> str:
    return (
        f"median {_fmt(v['median_baseline'])} -> {_fmt(v['median_canary'])}, shift "
        f"{_signed(v['effect'] or 0.0)} beyond the allowed {_fmt(v['allowed_effect'])}, "
        f"p={_fmt(v['p_value'])}"
    )


def _names(verdicts: list[MetricVerdict]) -> str:
    names = [v["name"] for v in verdicts]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.4g}"


def _signed(value: float) -> str:
    return f"{value:+.4g}"
