"""The strategy model: validation messages, the JSON round trip and wave assignment."""

from __future__ import annotations

from collections import Counter

import pytest
from django.core.exceptions import ValidationError

from controlplane.refresh.strategy import (
    Amount,
    Placed,
    assign_waves,
    parse_strategy,
    rollback_strategy,
)


def workers(per_namespace: dict[str, int]) -> list[Placed]:
    out = []
    n = 0
    for namespace, count in per_namespace.items():
        for _ in range(count):
            n += 1
            out.append(Placed(f"{namespace}/backend/generate/{1000 + n}", namespace, str(1000 + n)))
    return out


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kind": "rolling"}, "strategy.kind"),
        ({"kind": "waves"}, "waves need max_unavailable"),
        ({"kind": "waves", "max_unavailable": "0"}, "at least 1"),
        ({"kind": "waves", "max_unavailable": "150%"}, "cannot exceed 100%"),
        ({"kind": "waves", "max_unavailable": "ten"}, "neither a count nor a percentage"),
        ({"kind": "waves", "max_unavailable": True}, "expected a count"),
        ({"kind": "all_at_once", "max_unavailable": 2}, "not all_at_once"),
        ({"kind": "canary"}, "canary: expected an object"),
        ({"kind": "canary", "canary": {}}, "give a size"),
        ({"kind": "canary", "canary": {"size": 1, "instances": ["7"]}}, "not both"),
        ({"kind": "canary", "canary": {"instances": ["x"]}}, "not an instance id"),
        ({"kind": "canary", "canary": {"size": 1, "evaluation": "vibes"}}, "canary.evaluation"),
        ({"kind": "canary", "canary": {"size": 1, "timeout_seconds": 0}}, "between 1 and"),
        ({"kind": "canary", "canary": {"size": 1, "analysis": "a b"}}, "canary.analysis"),
        ({"kind": "canary", "canary": {"size": 1, "analysis": 7}}, "canary.analysis"),
        ({"kind": "canary", "canary": {"size": 1, "analysis": "x" * 65}}, "canary.analysis"),
        ({"kind": "waves", "max_unavailable": 1, "pause_after": [0]}, "numbered from 1"),
        ({"kind": "all_at_once", "pause_after": [1]}, "needs waves"),
        ({"kind": "waves", "max_unavailable": 1, "admit_as_verified": "yes"}, "true or false"),
        ({"kind": "waves", "max_unavailable": 1, "surge": 1}, "unknown field(s) surge"),
        ({"kind": "waves", "max_unavailable": 1, "canary": {"size": 1}}, "need kind 'canary'"),
    ],
)
def test_bad_strategies_are_refused_naming_the_field(raw, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_strategy(raw)


def test_the_json_form_round_trips():
    raw = {
        "kind": "canary",
        "max_unavailable": "25%",
        "max_failed": 2,
        "admit_as_verified": True,
        "pause_after": [2, 1, 2],
        "canary": {
            "instances": ["0042", "7"],
            "evaluation": "trainer",
            "timeout_seconds": 90,
            "analysis": "held-out",
        },
    }
    strategy = parse_strategy(raw)
    stored = strategy.to_dict()
    assert stored["pause_after"] == [1, 2]
    assert stored["canary"]["instances"] == ["42", "7"]
    assert stored["canary"]["analysis"] == "held-out"
    assert "analysed with template 'held-out'" in strategy.describe()
    assert parse_strategy(stored) == strategy
    assert parse_strategy(None).to_dict() == {"kind": "all_at_once", "max_failed": 0}


def test_percentages_round_down_but_a_wave_has_at_least_one_worker():
    assert Amount.parse("10%", "x", minimum=1).of(200) == 20
    assert Amount.parse("10%", "x", minimum=1).of(9, at_least=1) == 1
    assert Amount.parse("5%", "x", minimum=0).of(12) == 0
    assert Amount.parse(" 3 ", "x", minimum=0).of(12) == 3


def test_waves_are_cut_per_namespace():
    strategy = parse_strategy({"kind": "waves", "max_unavailable": "10%"})
    waves, count, blockers = assign_waves(strategy, workers({"a": 50, "b": 50, "c": 30}))
    assert blockers == []
    assert count == 10
    per_wave = Counter(waves.values())
    # 5 of a, 5 of b and 3 of c at a time.
    assert set(per_wave.values()) == {13}
    assert per_wave[1] == 13


def test_a_canary_goes_first_round_robin_across_namespaces():
    strategy = parse_strategy({"kind": "canary", "canary": {"size": 3}, "max_unavailable": 2})
    placed = workers({"a": 4, "b": 4})
    waves, count, blockers = assign_waves(strategy, placed)
    canary = [k for k, w in waves.items() if w == 1]
    assert len(canary) == 3
    assert {k.split("/")[0] for k in canary} == {"a", "b"}
    assert count == 1 + 2  # the five left, two per namespace at a time
    assert blockers == []


def test_named_canary_instances_that_are_not_in_the_scope_block_the_plan():
    strategy = parse_strategy({"kind": "canary", "canary": {"instances": ["1001", "99"]}})
    waves, count, blockers = assign_waves(strategy, workers({"a": 3}))
    assert [k for k, w in waves.items() if w == 1] == ["a/backend/generate/1001"]
    assert count == 2
    assert "99" in blockers[0]


def test_a_pause_after_the_last_wave_blocks_the_plan():
    strategy = parse_strategy({"kind": "waves", "max_unavailable": 2, "pause_after": [2]})
    _, count, blockers = assign_waves(strategy, workers({"a": 4}))
    assert count == 2
    assert "nothing left to wait for" in blockers[0]


def test_a_rollback_of_a_staged_refresh_runs_in_waves_of_the_same_size():
    canary = parse_strategy({"kind": "canary", "canary": {"size": 1}, "max_failed": 1})
    assert rollback_strategy(canary) == {
        "kind": "waves",
        "max_unavailable": "100%",
        "max_failed": 1,
    }
    waves = parse_strategy({"kind": "waves", "max_unavailable": "10%"})
    assert rollback_strategy(waves)["max_unavailable"] == "10%"
    assert rollback_strategy(parse_strategy({}))["kind"] == "all_at_once"
