"""A drifted worker's catch-up and a policy refresh never both own the worker.

Before, a catch-up to the gate's old policy could run while a refresh to a newer one updated
the same worker: whichever call came last decided what it served, and a refresh could hold on
a readback the catch-up had changed (or the catch-up could put old weights back behind a
verified gate). Now (controlplane/refresh/executor/handover.py) a refresh takes over the
quarantines of the workers it planned, a catch-up waits while a refresh holds its namespace,
a refresh does not start while a catch-up runs, and a catch-up aims at the gate's policy of the
moment it begins. Simulated fleet, PostgreSQL; the catch-up runs inline (no Celery) so each
interleaving is forced rather than hoped for.
"""

from __future__ import annotations

import pytest

from controlplane.audit.models import AuditEvent
from controlplane.refresh import drift, intents
from controlplane.refresh import quarantine as quarantines
from controlplane.refresh.errors import RefreshConflict
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    GateState,
    PolicyRefresh,
    Quarantine,
    QuarantineCall,
    QuarantineState,
    RefreshState,
    ScopeLock,
)
from tests.integration.drift.test_drift_quarantine import discover, gate, refreshed, restart_one
from tests.integration.refresh.helpers import actor_for, plan


@pytest.fixture(autouse=True)
def short_calls(settings):
    settings.REFRESH_CALL_TIMEOUT_SECONDS = 5.0


@pytest.fixture
def fleet(simfleet_factory):
    from tests.integration.refresh.helpers import fleet_config

    return simfleet_factory(fleet_config(6))


def drifted(fleet, operator) -> tuple[object, Quarantine, str]:
    """A source verified at v2 and one restarted worker of rl-a quarantined (catch-up queued,
    not run: no Celery worker here)."""
    source = refreshed(fleet, operator)
    _, new_id = restart_one(fleet)
    discover(source)
    (opened,) = drift.reconcile_source(source.pk)
    q = Quarantine.objects.get(pk=opened)
    assert q.instance_id == new_id and q.state == QuarantineState.QUARANTINED
    assert q.target["weight_version"] == "v2"
    return source, q, new_id


def test_a_refresh_takes_over_the_quarantine_of_a_worker_it_planned(
    fleet, operator, transactional_db
):
    source, q, new_id = drifted(fleet, operator)
    refresh = plan(source, operator, "v3")
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason

    q.refresh_from_db()
    assert q.state == QuarantineState.SUPERSEDED and f"#{refresh.pk}" in q.reason
    assert AuditEvent.objects.filter(
        action="quarantine.superseded", correlation_id=q.correlation_id
    ).exists()
    after = gate(source)
    assert after.state == GateState.OPEN and after.drift == []
    assert new_id in after.verified_instances and after.verified_version == "v3"
    assert fleet.state(new_id)["version"] == "v3" and not fleet.state(new_id)["paused"]

    # The catch-up that was queued for it arrives late: nothing to do, no call made.
    assert quarantines.catch_up(q.pk) == QuarantineState.SUPERSEDED
    assert not QuarantineCall.objects.filter(quarantine=q).exists()
    assert fleet.state(new_id)["version"] == "v3"


def test_a_catch_up_waits_while_a_refresh_holds_its_namespace(fleet, operator, transactional_db):
    source, q, new_id = drifted(fleet, operator)
    refresh = plan(source, operator, "v3")
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)

    assert quarantines.catch_up(q.pk) == QuarantineState.QUARANTINED
    q.refresh_from_db()
    assert q.attempts == 0 and f"policy refresh #{refresh.pk} holds rl-a" in q.reason
    assert not QuarantineCall.objects.filter(quarantine=q).exists()
    assert not fleet.state(new_id)["paused"]  # not even paused: the refresh owns it


def test_a_refresh_does_not_start_while_a_catch_up_runs(fleet, operator, transactional_db):
    source, q, _ = drifted(fleet, operator)
    refresh = plan(source, operator, "v3")
    assert quarantines.claim(q)  # a runner has it (catching_up) and is making its calls

    with pytest.raises(RefreshConflict) as refused:
        intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    assert f"quarantine #{q.pk}" in refused.value.message and q.key in refused.value.message
    assert not ScopeLock.objects.filter(source=source).exists()
    assert PolicyRefresh.objects.get(pk=refresh.pk).state == RefreshState.PLANNED


def test_a_catch_up_aims_at_the_gates_policy_when_it_begins(fleet, operator, transactional_db):
    # Found while the gate stood for an older policy (a refresh has moved it since, without
    # planning this worker): catching up to the old target would undo that refresh here.
    source, q, new_id = drifted(fleet, operator)
    older = dict(q.target, weight_version="v1", model_path="/ckpt/v1")
    Quarantine.objects.filter(pk=q.pk).update(target=older)

    assert quarantines.catch_up(q.pk) == QuarantineState.ADMITTED
    q.refresh_from_db()
    assert q.target["weight_version"] == "v2"
    assert fleet.state(new_id)["version"] == "v2"
    assert new_id in gate(source).verified_instances
