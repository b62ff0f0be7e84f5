"""Per-prompt metric values from hand-built observations."""

from __future__ import annotations

import math

import pytest

from controlplane.analysis.catalog import DRIFT, OUTPUT, SERVING
from controlplane.analysis.metrics import METRICS, moved_most, per_prompt_values
from controlplane.dynamo.observation import Observation


def _obs(prompt: int = 0, **fields) -> Observation:
    defaults = dict(
        instance_id="w1",
        ttft_ms=12.0,
        total_ms=80.0,
        completion_ids=(5, 6, 7, 8),
        completion_logprobs=(-0.1, -0.2, -0.3, -0.4),
        finish_reason="eos",
        continuation_logprobs=(-1.0, -2.0, -3.0),
    )
    defaults.update(fields)
    return Observation(prompt_index=prompt, **defaults)


def _values(baseline, canary, max_tokens=8):
    return per_prompt_values(baseline, canary, max_tokens=max_tokens)


def test_every_catalog_metric_is_computed_with_one_value_per_prompt():
    base, canary = _values([_obs(0), _obs(1)], [_obs(0), _obs(1)])
    assert set(base) == set(canary) == set(METRICS)
    assert {m.group for m in METRICS.values()} == {DRIFT, OUTPUT, SERVING}
    assert all(len(v) == 2 for v in [*base.values(), *canary.values()])


def test_a_healthy_identical_reply_has_no_drift_and_healthy_output():
    base, canary = _values([_obs()], [_obs()])
    for values in (base, canary):
        assert values["ref_logprob"] == [-2.0]
        assert values["kl_estimate"] == [0.0]
        assert values["zero_tokens"] == [0.0]
        assert values["non_terminal"] == [0.0]
        assert values["bad_logprobs"] == [0.0]
        assert values["distinct_2"] == [1.0]
        assert values["length_ratio"] == [0.5]
        assert values["error"] == [0.0]
        assert values["ttft_ms"] == [12.0]
        assert values["total_ms"] == [80.0]


def test_kl_estimate_is_the_mean_log_ratio_on_the_reference_tokens():
    base, canary = _values(
        [_obs(continuation_logprobs=(-1.0, -2.0, -3.0))],
        [_obs(continuation_logprobs=(-1.5, -2.0, -4.0))],
    )
    assert base["kl_estimate"] == [0.0]
    assert canary["kl_estimate"] == [pytest.approx((0.5 + 0.0 + 1.0) / 3)]
    assert canary["ref_logprob"] == [pytest.approx(-7.5 / 3)]


def test_kl_estimate_skips_tokens_without_a_usable_logprob_on_either_side():
    _, canary = _values(
        [_obs(continuation_logprobs=(None, -2.0, -3.0))],
        [_obs(continuation_logprobs=(-9.0, math.nan, -4.0))],
    )
    assert canary["kl_estimate"] == [1.0]  # only the third token is usable in both
    assert canary["ref_logprob"] == [pytest.approx(-6.5)]


def test_without_prompt_logprobs_drift_is_unavailable_not_zero():
    base, canary = _values(
        [_obs(0, continuation_logprobs=None), _obs(1, continuation_logprobs=None)],
        [_obs(0, continuation_logprobs=None), _obs(1, continuation_logprobs=None)],
    )
    for values in (base, canary):
        assert values["ref_logprob"] == [None, None]
        assert values["kl_estimate"] == [None, None]
        # The rest is still measured.
        assert values["zero_tokens"] == [0.0, 0.0]


def test_canary_kl_needs_the_baseline_reference():
    base, canary = _values([_obs(continuation_logprobs=None)], [_obs()])
    assert base["kl_estimate"] == [None]
    assert canary["kl_estimate"] == [None]
    assert canary["ref_logprob"] == [-2.0]


def test_zero_token_reply():
    _, canary = _values(
        [_obs()],
        [_obs(completion_ids=(), completion_logprobs=(), finish_reason="length")],
    )
    assert canary["zero_tokens"] == [1.0]
    assert canary["length_ratio"] == [0.0]
    # Nothing to score and no bigram: counted by zero_tokens, not as bad logprobs or repetition.
    assert canary["bad_logprobs"] == [0.0]
    assert canary["distinct_2"] == [None]


@pytest.mark.parametrize(
    "logprobs",
    [
        (-0.1, math.nan, -0.3, -0.4),
        (-0.1, None, -0.3, -0.4),
        (-0.1, -0.2, -0.3, math.inf),
        (),  # the reply carried no logprobs
        (-0.1, -0.2),  # fewer logprobs than tokens
    ],
)
def test_nan_none_or_absent_logprobs_are_bad(logprobs):
    _, canary = _values([_obs()], [_obs(completion_logprobs=logprobs)])
    assert canary["bad_logprobs"] == [1.0]


def test_repetition_lowers_distinct_2():
    _, canary = _values([_obs()], [_obs(completion_ids=(7, 7, 7, 7, 7), finish_reason="length")])
    assert canary["distinct_2"] == [0.25]  # one distinct bigram of four
    _, canary = _values([_obs()], [_obs(completion_ids=(1, 2, 1, 2, 1))])
    assert canary["distinct_2"] == [0.5]  # (1,2) and (2,1) of four


@pytest.mark.parametrize(
    ("finish", "non_terminal"),
    [("eos", 0.0), ("stop", 0.0), ("length", 0.0), ("cancelled", 1.0), ("error", 1.0), (None, 1.0)],
)
def test_non_terminal_finishes(finish, non_terminal):
    _, canary = _values([_obs()], [_obs(finish_reason=finish)])
    assert canary["non_terminal"] == [non_terminal]


def test_an_error_counts_as_error_and_leaves_everything_else_unobserved():
    _, canary = _values(
        [_obs()],
        [_obs(error="HTTP 500", ttft_ms=3.0, total_ms=4.0, completion_ids=(), finish_reason=None)],
    )
    assert canary["error"] == [1.0]
    assert {name: v for name, v in canary.items() if name != "error"} == {
        name: [None] for name in METRICS if name != "error"
    }


def test_prompts_line_up_across_cohorts_and_missing_prompts_are_none():
    base, canary = _values([_obs(0), _obs(2)], [_obs(2), _obs(5, ttft_ms=30.0)])
    assert base["ttft_ms"] == [12.0, 12.0, None]
    assert canary["ttft_ms"] == [None, 12.0, 30.0]
    assert base["error"] == [0.0, 0.0, None]


def test_several_workers_on_one_prompt_give_the_mean():
    _, canary = _values(
        [_obs()],
        [_obs(ttft_ms=10.0), _obs(instance_id="w2", ttft_ms=20.0, error="timeout")],
    )
    assert canary["error"] == [0.5]
    assert canary["ttft_ms"] == [10.0]


def test_empty_cohorts_give_empty_values():
    base, canary = _values([], [])
    assert base == canary == {name: [] for name in METRICS}


def test_max_tokens_must_be_positive():
    with pytest.raises(ValueError, match="max_tokens"):
        _values([_obs()], [_obs()], max_tokens=0)


def test_moved_most_ranks_by_drift_then_by_divergence():
    baseline = [_obs(i) for i in range(4)]
    canary = [
        _obs(0),
        _obs(1, continuation_logprobs=(-2.0, -3.0, -4.0)),  # shift -1
        _obs(2, continuation_logprobs=(-1.0, -2.0, -3.5)),  # shift -1/6
        _obs(3, completion_ids=(5, 9, 9, 9)),  # same drift as 0, diverges after one token
    ]
    moved = moved_most(baseline, canary, 3)
    assert [m["prompt_index"] for m in moved] == [1, 2, 3]
    assert moved[0]["ref_logprob_shift"] == -1.0
    assert moved[0]["kl_estimate"] == 1.0
    assert moved[2]["output_divergence"] == 0.75
    assert moved[2]["canary_ids"] == [5, 9, 9, 9]
    assert moved[2]["baseline_ids"] == [5, 6, 7, 8]


def test_moved_most_without_prompt_logprobs_ranks_by_divergence():
    baseline = [_obs(i, continuation_logprobs=None) for i in range(3)]
    canary = [
        _obs(0, continuation_logprobs=None),
        _obs(1, continuation_logprobs=None, error="HTTP 500", completion_ids=()),
        _obs(2, continuation_logprobs=None, completion_ids=(5, 6, 0, 0)),
    ]
    moved = moved_most(baseline, canary, 5)
    assert [(m["prompt_index"], m["output_divergence"]) for m in moved] == [
        (1, 1.0),
        (2, 0.5),
        (0, 0.0),
    ]
    assert moved[0]["canary_error"] == "HTTP 500"
    assert moved[0]["ref_logprob_shift"] is None
    assert moved_most(baseline, canary, 0) == []
