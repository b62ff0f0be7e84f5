"""Parsing analysis templates: defaults, the limits at and just over their edges, and each
refusal naming the field at fault."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from controlplane.analysis.catalog import CATALOG
from controlplane.analysis.rules import DECREASE, EITHER, INCREASE
from controlplane.analysis.spec import (
    MAX_CASE_TOKENS,
    MAX_PROMPTS,
    MAX_TEMPLATE_BYTES,
    TOKEN_ID_LIMIT,
    BackgroundSpec,
    PromptCase,
    default_metrics,
    min_prompts_problem,
    parse_template,
    read_prompt_lines,
    require_min_prompts,
    template_size,
)
from controlplane.jsonshapes import SHAPES, problems

ROOT = Path(__file__).resolve().parents[3]


def cases(n: int, length: int = 3) -> list[dict]:
    return [{"prompt": [i + 1] * length, "continuation": [7, 8]} for i in range(n)]


def errors_of(raw) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        parse_template(raw)
    return caught.value.message_dict


def test_absent_fields_take_their_defaults():
    spec = parse_template({"prompts": cases(20)})
    assert len(spec.prompts) == 20
    assert spec.prompts[0] == PromptCase((1, 1, 1), (7, 8))
    assert spec.min_prompts == 20 and spec.max_tokens == 16
    assert spec.background == BackgroundSpec()
    assert spec.background.on_fleet_breach == "notify"
    assert spec.background.window_seconds == 900 and spec.background.sample_prompts == 4
    assert spec.judge.metrics == default_metrics()
    assert (spec.judge.pass_score, spec.judge.marginal_score) == (95.0, 75.0)


def test_a_null_continuation_means_the_baseline_reply_is_the_reference():
    raw = cases(20)
    raw[0] = {"prompt": [5]}
    raw[1] = {"prompt": [6], "continuation": None}
    spec = parse_template({"prompts": raw})
    assert spec.prompts[0].continuation is None and spec.prompts[1].continuation is None


def test_the_default_judge_covers_the_whole_catalog():
    rules = {m.name: m for m in default_metrics()}
    assert list(rules) == list(CATALOG)
    for name, info in CATALOG.items():
        assert rules[name].direction == info.default_direction
        assert rules[name].group == info.group
    # Breaking drift or output means a broken checkpoint: critical; serving never alone.
    assert rules["ref_logprob"].critical and rules["ref_logprob"].must_have_data
    assert rules["kl_estimate"].critical and rules["kl_estimate"].must_have_data
    assert all(rules[n].critical for n in ("zero_tokens", "non_terminal", "bad_logprobs"))
    assert not any(rules[n].critical for n in ("error", "ttft_ms", "total_ms", "distinct_2"))


def test_to_dict_round_trips_and_fits_the_registered_shape():
    raw = {
        "prompts": [*cases(4), {"prompt": [0, TOKEN_ID_LIMIT - 1], "continuation": None}],
        "min_prompts": 5,
        "max_tokens": 256,
        "judge": {
            "metrics": [
                "ref_logprob",
                {"name": "ttft_ms", "direction": EITHER, "allowed_effect": 12, "group": "lat"},
            ],
            "group_weights": {"drift": 3, "lat": 0},
            "pass_score": 90,
            "marginal_score": 90,
            "alpha": 0.01,
            "min_samples": 5,
        },
        "background": {"on_fleet_breach": "rollback", "sample_prompts": 5},
    }
    spec = parse_template(raw)
    body = spec.to_dict()
    assert parse_template(body) == spec
    assert parse_template(json.loads(json.dumps(body))) == spec
    assert problems(body, SHAPES["analysis.AnalysisTemplate.body"]) == []
    assert body["judge"]["metrics"][1] == {
        "name": "ttft_ms",
        "direction": EITHER,
        "allowed_effect": 12.0,
        "critical": False,
        "group": "lat",
        "must_have_data": False,
    }
    assert spec.judge.group_weights == {"drift": 3.0, "lat": 0.0}


def test_too_few_prompts_for_min_prompts_is_refused_with_the_counts():
    assert "prompts" in errors_of({"prompts": cases(19)})
    message = errors_of({"prompts": cases(4), "min_prompts": 5})["prompts"][0]
    assert "4 prompts" in message and "at least 5" in message
    assert parse_template({"prompts": cases(5), "min_prompts": 5}).min_prompts == 5


def test_the_min_prompts_rule_a_plan_calls():
    spec = parse_template({"prompts": cases(20)})
    assert min_prompts_problem(spec) == ""
    require_min_prompts(spec)
    # A body stored under a lower bar (or written by hand) is refused the same way.
    short = type(spec)(prompts=spec.prompts[:7], judge=spec.judge, min_prompts=20)
    assert "7 prompts" in min_prompts_problem(short)
    with pytest.raises(ValidationError) as caught:
        require_min_prompts(short)
    assert list(caught.value.message_dict) == ["prompts"]


def test_min_prompts_is_at_least_the_judges_min_samples():
    errors = errors_of({"prompts": cases(20), "min_prompts": 4, "judge": {"min_samples": 5}})
    assert "judge.min_samples" in errors["min_prompts"][0]
    # Without min_prompts, a larger min_samples raises the default.
    spec = parse_template({"prompts": cases(30), "judge": {"min_samples": 30}})
    assert spec.min_prompts == 30


def test_prompt_count_at_and_over_the_limit():
    raw = {"prompts": cases(MAX_PROMPTS, length=1)}
    assert len(parse_template(raw).prompts) == MAX_PROMPTS
    errors = errors_of({"prompts": cases(MAX_PROMPTS + 1, length=1)})
    assert f"at most {MAX_PROMPTS}" in errors["prompts"][0]


def test_tokens_per_case_at_and_over_the_limit():
    at = [{"prompt": [1] * (MAX_CASE_TOKENS - 10), "continuation": [2] * 10}, *cases(19)]
    assert len(parse_template({"prompts": at}).prompts) == 20
    over = [{"prompt": [1] * (MAX_CASE_TOKENS - 10), "continuation": [2] * 11}, *cases(19)]
    errors = errors_of({"prompts": over})
    assert f"at most {MAX_CASE_TOKENS}" in errors["prompts[0]"][0]


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (TOKEN_ID_LIMIT, "[0, 2**31)"),
        (-1, "[0, 2**31)"),
        (True, "not an integer"),
        (1.0, "not an integer"),
        ("5", "not an integer"),
    ],
)
def test_token_ids_are_integers_in_range(token, why):
    raw = cases(20)
    raw[3] = {"prompt": [1, token]}
    errors = errors_of({"prompts": raw})
    assert why in errors["prompts[3].prompt"][0]


def test_empty_prompts_and_continuations_are_refused():
    raw = cases(20)
    raw[0] = {"prompt": []}
    raw[1] = {"prompt": [1], "continuation": []}
    raw[2] = [1, 2, 3]
    errors = errors_of({"prompts": raw})
    assert set(errors) >= {"prompts[0].prompt", "prompts[1].continuation", "prompts[2]"}
    # 17 good cases of 20 is not also "too few prompts": the bad ones are what to fix.
    assert "prompts" not in errors


def test_whole_template_size_at_and_over_one_mib():
    """The size is checked first, on the JSON as sent: padded (with a field that is itself
    refused) to exactly 1 MiB it passes the size check; one byte more and only it is said."""

    def padded(size: int) -> dict:
        raw = {"prompts": cases(20), "padding": ""}
        raw["padding"] = "x" * (size - template_size(raw))
        assert template_size(raw) == size
        return raw

    at = errors_of(padded(MAX_TEMPLATE_BYTES))
    assert "template" not in at and "padding" in at
    over = errors_of(padded(MAX_TEMPLATE_BYTES + 1))
    assert list(over) == ["template"] and "1 MiB" in over["template"][0]
    # A real template near the limit: many long prompts, refused by the size check whole.
    big = {"prompts": [{"prompt": [2**31 - 1] * 4000, "continuation": None}] * 100}
    assert "template" in errors_of(big)


def test_an_unknown_metric_names_the_catalog():
    errors = errors_of({"prompts": cases(20), "judge": {"metrics": ["ref_logprob", "reward"]}})
    message = errors["judge.metrics[1].name"][0]
    assert "'reward'" in message and "kl_estimate" in message


def test_a_metric_named_twice_is_refused():
    errors = errors_of({"prompts": cases(20), "judge": {"metrics": ["error", {"name": "error"}]}})
    assert "more than once" in errors["judge.metrics"][0]


@pytest.mark.parametrize(
    ("judge", "field"),
    [
        ({"pass_score": 80, "marginal_score": 81}, "judge.marginal_score"),
        ({"pass_score": 100.5}, "judge.pass_score"),
        ({"marginal_score": -1}, "judge.marginal_score"),
        ({"alpha": 0}, "judge.alpha"),
        ({"alpha": 0.6}, "judge.alpha"),
        ({"min_samples": 1}, "judge.min_samples"),
        ({"min_samples": 5.0}, "judge.min_samples"),
        ({"metrics": [{"name": "error", "direction": "up"}]}, "judge.metrics[0].direction"),
        (
            {"metrics": [{"name": "error", "allowed_effect": -0.1}]},
            "judge.metrics[0].allowed_effect",
        ),
        ({"metrics": [{"name": "error", "critical": "yes"}]}, "judge.metrics[0].critical"),
        ({"metrics": []}, "judge.metrics"),
        ({"group_weights": {"drfit": 1}}, "judge.group_weights.drfit"),
        ({"group_weights": {"drift": 0, "output": 0, "serving": 0}}, "judge.group_weights"),
        ({"thresholds": {}}, "judge.thresholds"),
    ],
)
def test_judge_refusals_name_their_field(judge, field):
    assert field in errors_of({"prompts": cases(20), "judge": judge})


def test_thresholds_at_their_edges():
    for pass_score, marginal in ((100, 100), (0, 0), (100, 0), (50, 50)):
        judge = parse_template(
            {"prompts": cases(20), "judge": {"pass_score": pass_score, "marginal_score": marginal}}
        ).judge
        assert (judge.pass_score, judge.marginal_score) == (pass_score, marginal)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 257}, "max_tokens"),
        ({"background": {"on_fleet_breach": "panic"}}, "background.on_fleet_breach"),
        (
            {"background": {"window_seconds": 120, "interval_seconds": 180}},
            "background.interval_seconds",
        ),
        ({"background": {"sample_prompts": 21}}, "background.sample_prompts"),
        ({"background": {"max_error_rate": 1.5}}, "background.max_error_rate"),
        ({"background": {"max_latency_ratio": 0.9}}, "background.max_latency_ratio"),
        ({"background": []}, "background"),
        ({"promtps": []}, "promtps"),
    ],
)
def test_other_refusals_name_their_field(raw, field):
    assert field in errors_of({"prompts": cases(20), **raw})


def test_max_tokens_at_its_limit():
    assert parse_template({"prompts": cases(20), "max_tokens": 256}).max_tokens == 256


def test_everything_wrong_is_said_at_once():
    errors = errors_of({"prompts": cases(20), "max_tokens": 0, "judge": {"alpha": 2}})
    assert {"max_tokens", "judge.alpha"} <= set(errors)


def test_not_an_object_is_refused():
    for raw in ([], "x", None, 3):
        assert "template" in errors_of(raw)


def test_a_prompt_file_is_json_lines():
    text = '{"prompt": [1, 2], "continuation": [3]}\n\n{"prompt": [4], "continuation": null}\n'
    assert read_prompt_lines(text) == [
        {"prompt": [1, 2], "continuation": [3]},
        {"prompt": [4], "continuation": None},
    ]
    with pytest.raises(ValidationError) as caught:
        read_prompt_lines('{"prompt": [1]}\n{"prompt": [1,\n')
    assert "line 2" in caught.value.message_dict["prompt_file"][0]


def test_the_docs_example_parses():
    page = (ROOT / "docs/operate/canary-analysis-templates.md").read_text()
    example = re.search(r"```json\n(.*?)```", page, re.S)
    assert example is not None
    spec = parse_template(json.loads(example.group(1)))
    assert len(spec.prompts) == 2 and spec.judge.metrics[0].direction == DECREASE
    assert spec.judge.metrics[2].direction == INCREASE
