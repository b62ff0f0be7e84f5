""" "Pause after this wave" asked for while a waves refresh really runs (Celery executor): the
wave in progress finishes, the refresh waits, and continue finishes it."""

from __future__ import annotations

import pytest

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.intents import pausepoints
from controlplane.refresh.models import PolicyRefresh, RefreshState, StepRun
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_versions,
    paused_workers,
    plan,
    wait_for,
)
from tests.integration.strategy.helpers import WAVES_OF_TWO, gates_of

#: The first wave's update is slowed by this much: the window in which the pause is asked for.
#: The test waits on real conditions, never on this figure.
SLOW_UPDATE_SECONDS = 6.0


def token_of(fleet, identity: str) -> str:
    return next(w["key"] for w in fleet.workers() if w["identity"] == identity)


def state_of(refresh: PolicyRefresh) -> PolicyRefresh:
    return PolicyRefresh.objects.get(pk=refresh.pk)


@pytest.mark.django_db(transaction=True)
def test_a_pause_asked_for_mid_wave_waits_after_that_wave_then_continue_finishes(
    fleet, source, operator, celery_worker
):
    refresh = plan(source, operator, "v2", strategy=WAVES_OF_TWO)
    assert not refresh.plan_blockers, refresh.plan_blockers
    assert refresh.waves == 2
    slow = token_of(fleet, refresh.workers.filter(wave=1).first().key)
    fleet.inject(slow, "update_weights_from_disk", Fault.latency(SLOW_UPDATE_SECONDS, once=True))

    intents.start_policy_refresh(refresh, actor=actor_for(operator))
    # Wave 1's update is under way (its step started, not finished) when the pause is asked.
    wait_for(
        lambda: StepRun.objects.filter(
            refresh=refresh, name="update", wave=1, finished_at__isnull=True
        ).exists()
    )
    running = state_of(refresh)
    assert running.state == RefreshState.UPDATING and running.wave == 1
    pausepoints.request_pause(running, actor=actor_for(operator))
    assert state_of(refresh).progress["pause_requested"] is True

    wait_for(lambda: state_of(refresh).state == RefreshState.WAITING)
    waiting = state_of(refresh)
    # It finished the wave in progress and stopped before the next one.
    assert waiting.wave == 1 and waiting.progress["waiting_after"] == 1
    assert not waiting.progress.get("pause_requested")
    assert not StepRun.objects.filter(refresh=refresh, wave=2).exists()
    assert waiting.lease_owner == ""
    assert paused_workers(fleet) == []
    versions = fleet_versions(fleet)
    wave_1 = set(refresh.workers.filter(wave=1).values_list("key", flat=True))
    assert {versions[k] for k in wave_1} == {"v2"}
    assert {v for k, v in versions.items() if k not in wave_1} == {"v1"}
    for gate in gates_of(source).values():
        sets = serialize_gate(gate)["instance_sets"]
        assert gate.verified_version == "v1"
        assert len(sets["verified_new"]) == 2 and len(sets["serving_old"]) == 2
    assert AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="policy_refresh.pause_requested"
    ).exists()

    pausepoints.continue_refresh(waiting, actor=actor_for(operator))
    wait_for(lambda: state_of(refresh).state == RefreshState.SUCCEEDED)
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert all(
        g.verified_version == "v2" and len(g.verified_instances) == 4
        for g in gates_of(source).values()
    )
