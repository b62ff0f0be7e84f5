"""A rollback drill on the simulated fleet, run in this thread: both directions verified and
timed, the rest of the fleet untouched, and a failing back direction that leaves the subset
outside the gate with an exit."""

from __future__ import annotations

import pytest

from controlplane.refresh import intents
from controlplane.refresh.drills.actions import start_drill
from controlplane.refresh.drills.runner import advance
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import DrillOutcome, Gate, RefreshState
from controlplane.simfleet import Fault
from tests.integration.drills.helpers import (
    actor_for,
    called_instances,
    run_drill_inline,
    verified_sets,
    verified_twice,
)
from tests.integration.refresh.helpers import fleet_config, fleet_versions

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet, operator):
    return verified_twice(fleet, operator)


def test_a_drill_proves_rollback_both_ways_and_records_durations(fleet, source, operator):
    before = verified_sets(source)
    drill = start_drill(source, actor=actor_for(operator), enqueue=False)
    # One worker per namespace, the lowest instance id of each gate's verified set.
    assert sorted(drill.instances, key=int) == sorted(
        (min(ids, key=int) for ids in before.values()), key=int
    )
    assert drill.previous_version == "v1" and drill.current_version == "v2"

    drill = run_drill_inline(drill)

    assert drill.outcome == DrillOutcome.SUCCEEDED, drill.reason
    forward, back = drill.forward_refresh, drill.back_refresh
    assert forward.state == back.state == RefreshState.SUCCEEDED
    assert forward.weight_version == "v1" and back.weight_version == "v2"
    assert set(forward.instances) == set(back.instances) == set(drill.instances)
    # Only the subset was called, in both directions.
    assert called_instances(forward) == called_instances(back) == set(drill.instances)
    # Durations recorded, each the refresh's own span.
    assert drill.forward_seconds > 0 and drill.back_seconds > 0
    assert drill.forward_seconds <= (forward.finished_at - forward.started_at).total_seconds()
    assert drill.finished_at is not None
    # Everything is back: every worker on v2, every gate open at v2 with its full set.
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert verified_sets(source) == before
    assert all(
        g.state == "open" and g.verified_version == "v2" for g in Gate.objects.filter(source=source)
    )


def test_a_drill_of_named_instances_in_one_namespace(fleet, source, operator):
    gate = Gate.objects.get(source=source, namespace="rl-a")
    chosen = sorted(gate.verified_instances, key=int)[-1:]
    drill = start_drill(
        source, actor=actor_for(operator), namespaces=["rl-a"], instances=chosen, enqueue=False
    )
    drill = run_drill_inline(drill)
    assert drill.outcome == DrillOutcome.SUCCEEDED, drill.reason
    assert drill.namespaces == ["rl-a"]
    assert called_instances(drill.forward_refresh) == set(chosen)


def test_a_failing_back_direction_leaves_the_subset_out_of_the_gate_with_an_exit(
    fleet, source, operator
):
    drill = start_drill(source, actor=actor_for(operator), namespaces=["rl-a"], enqueue=False)
    (instance,) = drill.instances
    key = next(w["key"] for w in fleet.workers() if str(w["instance_id"]) == instance)

    def forward_then_break(refresh_id: int) -> None:
        execute_refresh(refresh_id)
        # After the forward direction, the subset's next update (the way back) fails.
        fleet.inject(key, "update_weights_from_disk", Fault.error("disk full"))

    assert advance(drill.pk, execute=forward_then_break)
    drill.refresh_from_db()

    assert drill.outcome == DrillOutcome.FAILED
    assert drill.forward_seconds is not None and drill.back_seconds is None
    back = drill.back_refresh
    assert back.state == RefreshState.HELD
    assert f"#{back.pk}" in drill.reason and "held" in drill.reason
    # The subset is on the old policy, outside the verified set; the rest still serve verified.
    assert {str(w["instance_id"]): w["version"] for w in fleet.workers()}[instance] == "v1"
    gate = Gate.objects.get(source=source, namespace="rl-a")
    assert instance not in gate.verified_instances
    assert gate.verified_version == "v2" and gate.is_open and gate.verified_instances
    # The exit: the held refresh, named with what to do; retrying it brings the subset back.
    assert f"policy refresh #{back.pk} is held" in drill.next_step
    assert "retry" in drill.next_step
    fleet.clear_faults(key)
    intents.retry_policy_refresh(back, actor=actor_for(operator))
    execute_refresh(back.pk)
    back.refresh_from_db()
    assert back.state == RefreshState.SUCCEEDED, back.held_reason
    gate.refresh_from_db()
    assert instance in gate.verified_instances


def test_a_back_direction_that_cannot_start_quarantines_the_subset(fleet, source, operator):
    from controlplane.fleet.models import Source
    from controlplane.refresh.models import Quarantine

    drill = start_drill(source, actor=actor_for(operator), namespaces=["rl-b"], enqueue=False)
    (instance,) = drill.instances

    def forward_then_disable(refresh_id: int) -> None:
        execute_refresh(refresh_id)
        # The way back is blocked: the generation check has no frontend to call any more.
        Source.objects.filter(pk=source.pk).update(frontend_url="")

    assert advance(drill.pk, execute=forward_then_disable)
    drill.refresh_from_db()

    assert drill.outcome == DrillOutcome.FAILED
    assert "back refresh" in drill.reason and "frontend URL" in drill.reason
    assert drill.back_refresh.state == RefreshState.ABORTED  # the blocked plan was discarded
    q = Quarantine.objects.get(source=source, instance_id=instance)
    assert q.kind == "drill" and q.state == "quarantined"
    assert q.target["weight_version"] == "v2"
    assert f"#{q.pk}" in drill.next_step and "caught up to 'v2'" in drill.next_step
    assert instance not in Gate.objects.get(source=source, namespace="rl-b").verified_instances
