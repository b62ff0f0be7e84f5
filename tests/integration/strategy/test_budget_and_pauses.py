"""The failure budget and pause points on the simulated fleet (executor run in this thread)."""

from __future__ import annotations

import pytest

from controlplane.refresh import intents
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.intents import pausepoints
from controlplane.refresh.models import (
    PolicyRefresh,
    Quarantine,
    RefreshState,
    ScopeLock,
)
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_versions,
    paused_workers,
    run_inline,
)
from tests.integration.strategy.helpers import WAVES_OF_TWO, gates_of, keys_in, most_paused_at_once

pytestmark = pytest.mark.django_db


def instance_of(fleet, key: str) -> str:
    return str(next(w["instance_id"] for w in fleet.workers() if w["key"] == key))


# -- failure budget ------------------------------------------------------------------------------


def test_two_broken_workers_within_a_budget_of_two_are_quarantined_and_the_rest_open(
    fleet, source, operator
):
    broken_update = keys_in(fleet, "rl-a")[3]  # in the second wave of rl-a
    broken_verify = keys_in(fleet, "rl-b")[0]  # in the first wave of rl-b
    fleet.inject(broken_update, "update_weights_from_disk", Fault.error("disk full"))
    fleet.inject(broken_verify, "update_weights_from_disk", Fault.revert_version(once=False))

    refresh = run_inline(source, operator, "v2", strategy={**WAVES_OF_TWO, "max_failed": 2})

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    gates = gates_of(source)
    assert all(g.state == "open" and g.verified_version == "v2" for g in gates.values())
    left_out = {instance_of(fleet, broken_update), instance_of(fleet, broken_verify)}
    verified = {i for g in gates.values() for i in g.verified_instances}
    assert len(verified) == 10 and not verified & left_out
    # Never silently: the gate says how many were left out, and why.
    shown = serialize_gate(gates["rl-a"])
    assert shown["left_out_count"] == 1
    assert shown["left_out"][0]["instance_id"] == instance_of(fleet, broken_update)
    assert "failed update" in shown["left_out"][0]["detail"]
    assert "disk full" in shown["left_out"][0]["detail"]
    assert serialize_gate(gates["rl-b"])["left_out_count"] == 1
    assert "failed verify" in serialize_gate(gates["rl-b"])["left_out"][0]["detail"]
    assert serialize_gate(gates["rl-c"])["left_out_count"] == 0
    # Both are quarantined, paused, out of the verified set, with their reasons.
    quarantines = {q.instance_id: q for q in Quarantine.objects.filter(source=source)}
    assert set(quarantines) == left_out
    assert all(
        q.state == "failed" and q.paused and q.kind == "left_out" for q in quarantines.values()
    )
    assert "disk full" in quarantines[instance_of(fleet, broken_update)].reason
    assert sorted(paused_workers(fleet)) == sorted([broken_update, broken_verify])
    versions = fleet_versions(fleet)
    assert sum(1 for v in versions.values() if v == "v2") >= 10
    # The rest went through in waves of two per namespace.
    assert most_paused_at_once(refresh) <= 6 + 2


def test_three_broken_workers_over_a_budget_of_two_hold(fleet, source, operator):
    for key in (keys_in(fleet, "rl-a")[0], keys_in(fleet, "rl-b")[0], keys_in(fleet, "rl-c")[1]):
        fleet.inject(key, "update_weights_from_disk", Fault.error("disk full"))

    refresh = run_inline(source, operator, "v2", strategy={**WAVES_OF_TWO, "max_failed": 2})

    assert refresh.state == RefreshState.HELD
    assert refresh.failed_step == "update"
    assert "over the failure budget" in refresh.held_reason
    # Whichever two failed first used the budget up; the third holds the refresh.
    assert Quarantine.objects.filter(source=source).count() <= 2
    # The gates never closed: they still admit v1 for the workers no wave has reached.
    gates = gates_of(source)
    assert all(g.state == "open" and g.verified_version == "v1" for g in gates.values())
    assert all("held" in g.reason for g in gates.values())
    for gate in gates.values():
        assert sorted(gate.verified_instances) == sorted(gate.instance_sets["serving_old"])


def test_a_percentage_budget_rounds_down(fleet, source, operator):
    fleet.inject(keys_in(fleet, "rl-a")[0], "update_weights_from_disk", Fault.error("disk full"))
    # 5% of 12 workers is 0.6: no worker may fail.
    refresh = run_inline(source, operator, "v2", strategy={**WAVES_OF_TWO, "max_failed": "5%"})
    assert refresh.state == RefreshState.HELD


# -- pause points ----------------------------------------------------------------------------------


def test_a_pause_point_waits_with_the_gate_naming_both_sets_then_continues(fleet, source, operator):
    refresh = run_inline(source, operator, "v2", strategy={**WAVES_OF_TWO, "pause_after": [1]})

    assert refresh.state == RefreshState.WAITING
    assert refresh.wave == 1 and refresh.waves == 2
    assert paused_workers(fleet) == []
    assert ScopeLock.objects.filter(refresh=refresh).count() == 3
    for gate in gates_of(source).values():
        # Still admitting v1, for exactly the two instances still on it.
        assert gate.state == "open" and gate.verified_version == "v1"
        sets = serialize_gate(gate)["instance_sets"]
        assert sets["from_version"] == "v1" and sets["to_version"] == "v2"
        assert len(sets["serving_old"]) == 2 and len(sets["verified_new"]) == 2
        assert sorted(gate.verified_instances) == sorted(sets["serving_old"])
        assert sets["in_flight"] == []
    with pytest.raises(InvalidTransition):
        intents.retry_policy_refresh(refresh, actor=actor_for(operator))

    pausepoints.continue_refresh(refresh, actor=actor_for(operator), enqueue=False)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert all(len(g.verified_instances) == 4 for g in gates_of(source).values())


def test_aborting_at_a_pause_point_ends_with_the_old_set_still_admitted(fleet, source, operator):
    refresh = run_inline(source, operator, "v2", strategy={**WAVES_OF_TWO, "pause_after": [1]})
    assert refresh.state == RefreshState.WAITING

    intents.abort_policy_refresh(refresh, actor=actor_for(operator))
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()

    assert refresh.state == RefreshState.ABORTED
    assert not ScopeLock.objects.filter(refresh=refresh).exists()
    with pytest.raises(InvalidTransition):
        pausepoints.continue_refresh(refresh, actor=actor_for(operator), enqueue=False)
    for gate in gates_of(source).values():
        assert gate.state == "open" and gate.verified_version == "v1"
        assert len(gate.verified_instances) == 2
        assert gate.active_refresh_id is None and gate.instance_sets == {}


def test_rolling_back_from_a_pause_point_returns_the_scope_in_waves(fleet, source, operator):
    refresh = run_inline(
        source,
        operator,
        "v2",
        strategy={**WAVES_OF_TWO, "pause_after": [1], "admit_as_verified": True},
    )
    assert refresh.state == RefreshState.WAITING
    # admit_as_verified: the gate already stands for v2, for the wave verified so far.
    assert {g.verified_version for g in gates_of(source).values()} == {"v2"}

    rollback = intents.rollback_policy_refresh(refresh, actor=actor_for(operator))
    execute_refresh(rollback.pk)
    rollback.refresh_from_db()
    refresh.refresh_from_db()

    assert refresh.state == RefreshState.ROLLED_BACK
    assert rollback.target["weight_version"] == "v1"
    assert rollback.strategy["kind"] == "waves"
    assert rollback.state == RefreshState.SUCCEEDED, rollback.held_reason
    assert set(fleet_versions(fleet).values()) == {"v1"}
    assert all(
        g.verified_version == "v1" and len(g.verified_instances) == 4
        for g in gates_of(source).values()
    )


def test_a_pause_asked_for_mid_run_is_refused_once_nothing_is_left(fleet, source, operator):
    refresh = run_inline(source, operator, "v2", strategy={**WAVES_OF_TWO, "pause_after": [1]})
    with pytest.raises(InvalidTransition):
        pausepoints.request_pause(refresh, actor=actor_for(operator))  # waiting already
    refresh = PolicyRefresh.objects.get(pk=refresh.pk)
    assert refresh.state == RefreshState.WAITING
