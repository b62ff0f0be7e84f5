"""The judge at its edges: thresholds, effect sizes, critical metrics, missing data."""

from __future__ import annotations

import json
import math

import pytest

from controlplane.analysis.judge import FAIL, INCONCLUSIVE, MARGINAL, NODATA, PASS, judge
from controlplane.analysis.rules import DECREASE, EITHER, INCREASE, JudgeSpec, MetricRule

N = 10
#: A metric whose canary clearly rose by 1 (p ~ 1e-5): it fails with an allowance below 1.
ROSE = ([0.0] * N, [1.0] * N)
#: A metric with no change at all (zero variance): it passes.
SAME = ([0.0] * N, [0.0] * N)


def _rule(name: str, **fields) -> MetricRule:
    fields.setdefault("direction", INCREASE)
    fields.setdefault("allowed_effect", 0.5)
    return MetricRule(name=name, **fields)


def _run(rules, data, **spec_fields):
    """data: metric name -> (baseline values, canary values)."""
    spec = JudgeSpec(metrics=tuple(rules), **spec_fields)
    report = judge(spec, {k: v[0] for k, v in data.items()}, {k: v[1] for k, v in data.items()})
    json.dumps(report, allow_nan=False)  # JSON-safe whatever the outcome
    return report


def _passing_and_failing(passed: int, failed: int, **rule_fields):
    rules = [_rule(f"ok{i}", **rule_fields) for i in range(passed)]
    rules += [_rule(f"bad{i}", **rule_fields) for i in range(failed)]
    data = {r.name: SAME if r.name.startswith("ok") else ROSE for r in rules}
    return rules, data


def _verdict(report, name):
    return next(m for m in report["metrics"] if m["name"] == name)


# Score thresholds ---------------------------------------------------------------------------


def test_score_exactly_at_pass_score_passes():
    rules, data = _passing_and_failing(19, 1)
    report = _run(rules, data, pass_score=95.0, marginal_score=75.0)
    assert report["score"] == 95.0
    assert report["outcome"] == PASS
    assert "bad0 failed" in report["summary"]


def test_score_just_below_pass_score_is_marginal():
    rules, data = _passing_and_failing(19, 1)
    report = _run(rules, data, pass_score=95.000001, marginal_score=75.0)
    assert report["outcome"] == MARGINAL
    assert report["summary"].startswith("Marginal: score 95 is below the pass score")


def test_score_exactly_at_marginal_score_is_marginal_and_just_below_fails():
    rules, data = _passing_and_failing(3, 1)
    assert _run(rules, data, marginal_score=75.0)["outcome"] == MARGINAL
    report = _run(rules, data, marginal_score=75.000001)
    assert report["outcome"] == FAIL
    assert report["summary"].startswith("Failed: score 75 is below the marginal score")


def test_a_weighted_score_meant_to_be_exact_meets_the_threshold_despite_float_rounding():
    # Three groups of weight 0.1, shares 1, 1 and 1/4: 75 exactly, 74.99999999999999 in float.
    rules = [_rule("a", group="a"), _rule("b", group="b")]
    rules += [_rule(f"c{i}", group="c") for i in range(4)]
    data = {r.name: SAME for r in rules}
    data.update({f"c{i}": ROSE for i in range(3)})
    weights = {"a": 0.1, "b": 0.1, "c": 0.1}
    report = _run(rules, data, group_weights=weights, marginal_score=75.0)
    assert report["score"] == 75.0
    assert report["outcome"] == MARGINAL


def test_group_weights_and_the_default_weight_of_an_unnamed_group():
    rules = [_rule("drift", group="drift"), _rule("serving", group="serving")]
    rules.append(_rule("output", group="output"))
    data = {"drift": SAME, "serving": ROSE, "output": SAME}
    # drift 3, serving 1, output unnamed -> the mean of the named weights, 2.
    report = _run(rules, data, group_weights={"drift": 3.0, "serving": 1.0})
    assert report["score"] == pytest.approx(100 * 5 / 6, abs=1e-4)
    assert {g["group"]: g["weight"] for g in report["groups"]} == {
        "drift": 3.0,
        "serving": 1.0,
        "output": 2.0,
    }
    serving = next(g for g in report["groups"] if g["group"] == "serving")
    assert (serving["counted"], serving["passed"], serving["share"]) == (1, 0, 0.0)


def test_all_judged_groups_weighing_zero_is_inconclusive():
    report = _run([_rule("a", group="a")], {"a": SAME}, group_weights={"a": 0.0})
    assert report["outcome"] == INCONCLUSIVE
    assert report["score"] is None


# Effect size ---------------------------------------------------------------------------------


def test_effect_exactly_at_allowed_effect_passes_and_just_beyond_fails():
    rule = _rule("m", allowed_effect=0.5)
    at = _run([rule], {"m": ([0.0] * N, [0.5] * N)})
    assert _verdict(at, "m")["effect"] == 0.5
    assert _verdict(at, "m")["p_value"] < 0.05
    assert _verdict(at, "m")["verdict"] == PASS
    beyond = _run([rule], {"m": ([0.0] * N, [0.5000001] * N)})
    assert _verdict(beyond, "m")["verdict"] == FAIL
    assert beyond["outcome"] == FAIL


def test_an_effect_equal_to_the_allowance_up_to_float_rounding_passes():
    # 1.1 - 1.0 is 0.10000000000000009.
    report = _run([_rule("m", allowed_effect=0.1)], {"m": ([1.0] * N, [1.1] * N)})
    assert _verdict(report, "m")["verdict"] == PASS


@pytest.mark.parametrize(
    ("direction", "shift", "verdict"),
    [
        (INCREASE, +1.0, FAIL),
        (INCREASE, -1.0, PASS),
        (DECREASE, -1.0, FAIL),
        (DECREASE, +1.0, PASS),
        (EITHER, +1.0, FAIL),
        (EITHER, -1.0, FAIL),
    ],
)
def test_only_the_bad_direction_fails(direction, shift, verdict):
    report = _run(
        [_rule("m", direction=direction, allowed_effect=0.5)], {"m": ([0.0] * N, [shift] * N)}
    )
    assert _verdict(report, "m")["verdict"] == verdict
    assert _verdict(report, "m")["effect"] == shift


def test_a_large_shift_that_is_not_significant_passes():
    # Two prompts each side: no test can be significant at 0.05 with so few values.
    report = _run([_rule("m")], {"m": ([0.0, 0.1], [5.0, 6.0])}, min_samples=2)
    verdict = _verdict(report, "m")
    assert verdict["effect"] > 0.5
    assert verdict["p_value"] >= 0.05
    assert verdict["verdict"] == PASS
    assert verdict["reason"].startswith("no significant difference")


def test_identical_values_give_p_one_and_no_failure():
    report = _run([_rule("m", allowed_effect=0.0, critical=True)], {"m": SAME})
    verdict = _verdict(report, "m")
    assert (verdict["p_value"], verdict["effect"], verdict["verdict"]) == (1.0, 0.0, PASS)
    assert report["outcome"] == PASS


# Critical metrics and missing data -------------------------------------------------------------


def test_a_critical_failure_fails_even_with_a_high_score():
    rules, data = _passing_and_failing(99, 0)
    rules.append(_rule("error", critical=True))
    data["error"] = ROSE
    report = _run(rules, data)
    assert report["score"] == 99.0
    assert report["outcome"] == FAIL
    assert report["summary"].startswith(
        "Failed: critical metric error rose on the canary (median 0 -> 1, shift +1 beyond the "
        "allowed 0.5, p="
    )


def test_a_critical_failure_fails_even_when_required_data_is_missing():
    rules = [_rule("error", critical=True), _rule("kl", must_have_data=True)]
    rules.append(_rule("ttft", critical=True, direction=EITHER))
    data = {"error": ROSE, "kl": ([None] * N, [None] * N), "ttft": ([1.0] * N, [0.0] * N)}
    report = _run(rules, data)
    assert report["outcome"] == FAIL
    assert report["summary"].startswith(
        "Failed: critical metrics error and ttft moved the bad way; error rose on the canary"
    )


def test_must_have_data_without_data_is_inconclusive_and_counts_against_the_score():
    rules, data = _passing_and_failing(3, 0)
    rules.append(_rule("kl", must_have_data=True))
    data["kl"] = ([0.0] * N, [None] * N)
    report = _run(rules, data)
    assert _verdict(report, "kl")["verdict"] == NODATA
    assert report["outcome"] == INCONCLUSIVE
    assert report["score"] == 75.0
    assert report["summary"].startswith("Inconclusive: kl must have data")


def test_must_have_data_missing_holds_for_a_person_rather_than_failing_on_the_score():
    rules, data = _passing_and_failing(1, 2)
    rules.append(_rule("kl", must_have_data=True))
    report = _run(rules, data)  # "kl" absent from the values altogether
    assert report["score"] == 25.0
    assert report["outcome"] == INCONCLUSIVE


def test_nodata_without_must_have_data_is_left_out_of_the_score():
    rules, data = _passing_and_failing(2, 0)
    rules.append(_rule("ttft", critical=True))
    data["ttft"] = ([1.0] * N, [])
    report = _run(rules, data)
    assert _verdict(report, "ttft")["verdict"] == NODATA
    assert report["score"] == 100.0
    assert report["outcome"] == PASS
    assert report["summary"] == "Passed: score 100 with 2 of 3 metrics judged, none failed."


def test_min_samples_edge():
    rule = _rule("m")
    five = _run([rule], {"m": ([0.0] * 5, [1.0] * 5)}, min_samples=5)
    assert _verdict(five, "m")["verdict"] != NODATA
    # None and NaN are not usable values: four usable in the canary is too few.
    four = _run([rule], {"m": ([0.0] * 5, [1.0, 1.0, 1.0, 1.0, None, math.nan])}, min_samples=5)
    verdict = _verdict(four, "m")
    assert verdict["verdict"] == NODATA
    assert (verdict["n_baseline"], verdict["n_canary"]) == (5, 4)
    assert verdict["reason"] == "fewer than 5 usable values (baseline 5, canary 4)"
    assert verdict["p_value"] is None
    assert four["outcome"] == INCONCLUSIVE


def test_empty_cohorts_are_inconclusive_without_a_score():
    rules = [_rule("a"), _rule("b")]
    report = _run(rules, {"a": ([], []), "b": ([None] * N, [None] * N)})
    assert report["outcome"] == INCONCLUSIVE
    assert report["score"] is None
    assert report["summary"].startswith("Inconclusive: no metric had 5 usable values")
    assert all(g["share"] is None for g in report["groups"])


def test_the_report_rounds_floats_and_keeps_what_was_decided():
    report = _run([_rule("m", allowed_effect=0.0)], {"m": ([0.1] * N, [0.1 + 0.2] * N)})
    verdict = _verdict(report, "m")
    assert verdict["effect"] == 0.2
    assert verdict["median_canary"] == 0.3
    assert verdict["method"] == "asymptotic"
    assert verdict["verdict"] == FAIL


@pytest.mark.parametrize(
    ("spec_fields", "rule_fields", "message"),
    [
        ({"alpha": 0.0}, {}, "alpha"),
        ({"min_samples": 0}, {}, "min_samples"),
        ({"pass_score": 70.0, "marginal_score": 80.0}, {}, "marginal_score <= pass_score"),
        ({"group_weights": {"default": -1.0}}, {}, "weight"),
        ({}, {"direction": "sideways"}, "direction"),
        ({}, {"allowed_effect": -0.1}, "allowed_effect"),
        ({}, {"allowed_effect": math.nan}, "allowed_effect"),
    ],
)
def test_a_bad_spec_is_refused_with_a_clear_error(spec_fields, rule_fields, message):
    with pytest.raises(ValueError, match=message):
        _run([_rule("m", **rule_fields)], {"m": SAME}, **spec_fields)


def test_a_metric_named_twice_is_refused():
    with pytest.raises(ValueError, match="named twice"):
        _run([_rule("m"), _rule("m")], {"m": SAME})


def test_whole_numbers_in_a_spec_are_reported_as_json_floats():
    # A spec parsed from JSON may hold ints; the report's float fields stay floats.
    spec = JudgeSpec(
        metrics=(MetricRule("m", INCREASE, 0),),  # type: ignore[arg-type]
        group_weights={"default": 2},  # type: ignore[dict-item]
        pass_score=95,  # type: ignore[arg-type]
        marginal_score=75,  # type: ignore[arg-type]
    )
    report = judge(spec, {"m": SAME[0]}, {"m": SAME[1]})
    assert isinstance(report["metrics"][0]["allowed_effect"], float)
    assert isinstance(report["groups"][0]["weight"], float)
    assert isinstance(report["pass_score"], float)
    assert isinstance(report["marginal_score"], float)
