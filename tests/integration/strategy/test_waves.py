"""`waves` on the simulated fleet through Celery and Redis: bounded pauses, gate sets, the end."""

from __future__ import annotations

import pytest

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents
from controlplane.refresh.models import EXECUTING_STATES, PolicyRefresh, RefreshState, StepRun
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_versions,
    make_source,
    paused_workers,
    plan,
    wait_for,
)
from tests.integration.strategy.helpers import config, gates_of, most_paused_at_once

pytestmark = pytest.mark.django_db(transaction=True)


def ended(refresh_id: int, timeout: float) -> PolicyRefresh:
    def done():
        r = PolicyRefresh.objects.get(pk=refresh_id)
        return r if r.state not in (*EXECUTING_STATES, RefreshState.PLANNED) else None

    return wait_for(done, timeout=timeout, interval=0.2)


def test_two_hundred_workers_in_waves_of_ten_percent_never_pause_more_than_twenty(
    simfleet_factory, operator, celery_worker
):
    fleet = simfleet_factory(config(200))
    source = make_source(fleet)
    refresh = plan(source, operator, "v2", strategy={"kind": "waves", "max_unavailable": "10%"})
    assert not refresh.plan_blockers, refresh.plan_blockers
    # 50 workers per namespace, 5 of each at a time: ten waves of 20.
    assert refresh.waves == 10
    intents.start_policy_refresh(refresh, actor=actor_for(operator))
    refresh = ended(refresh.pk, timeout=600)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert most_paused_at_once(refresh) <= 20
    assert most_paused_at_once(refresh) > 0
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert paused_workers(fleet) == []
    gates = gates_of(source)
    assert len(gates) == 4
    for gate in gates.values():
        assert gate.state == "open" and gate.verified_version == "v2"
        assert len(gate.verified_instances) == 50
        assert gate.instance_sets == {}
    # Every worker step ran once per wave; the gate moved wave by wave.
    assert StepRun.objects.filter(refresh=refresh, name="pause", status="ok").count() == 10
    wave_events = AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="policy_refresh.wave_verified"
    )
    assert wave_events.count() == 9  # the last wave is followed by the reopen
    assert not AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="gate.closed"
    ).exists()
