"""A running drill holds its scope for its whole length, and the schedule waits for a held
scope instead of recording a failed drill. Simulated fleet, real PostgreSQL, run in this
thread."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents
from controlplane.refresh.drills.actions import start_drill
from controlplane.refresh.drills.runner import advance
from controlplane.refresh.errors import RefreshConflict
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.intents import lifecycle
from controlplane.refresh.models import DrillOutcome, DrillRun, RefreshState, ScopeLock
from controlplane.refresh.tasks import drill_tick
from controlplane.simfleet.tokens import expected_completion_ids
from tests.integration.drills.helpers import actor_for, verified_twice
from tests.integration.refresh.helpers import fleet_config, fleet_versions, plan, run_inline

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet, operator):
    return verified_twice(fleet, operator)


def test_a_refresh_started_between_a_drills_legs_is_refused_and_the_drill_completes(
    fleet, source, operator
):
    drill = start_drill(source, actor=actor_for(operator), enqueue=False)
    intruder = plan(source, operator, "v3")
    assert not intruder.plan_blockers, intruder.plan_blockers
    refusals: list[str] = []

    def execute(refresh_id: int) -> None:
        execute_refresh(refresh_id)
        if refresh_id != DrillRun.objects.get(pk=drill.pk).forward_refresh_id:
            return
        # The forward leg has ended and released its scope locks; the back leg has not
        # started. A refresh on the same scope must not slip into this gap.
        assert not ScopeLock.objects.filter(source=source).exists()
        with pytest.raises(RefreshConflict) as refused:
            intents.start_policy_refresh(intruder, actor=actor_for(operator), enqueue=False)
        refusals.append(refused.value.message)

    assert advance(drill.pk, execute=execute)
    drill.refresh_from_db()

    assert len(refusals) == 1
    assert f"rollback drill #{drill.pk}" in refusals[0]
    assert drill.outcome == DrillOutcome.SUCCEEDED, drill.reason
    assert drill.forward_refresh.state == drill.back_refresh.state == RefreshState.SUCCEEDED
    intruder.refresh_from_db()
    assert intruder.state == RefreshState.PLANNED  # refused, changed nothing
    assert set(fleet_versions(fleet).values()) == {"v2"}

    # The hold is the running drill itself: once it ended, the same refresh starts.
    intents.start_policy_refresh(intruder, actor=actor_for(operator), enqueue=False)
    execute_refresh(intruder.pk)
    intruder.refresh_from_db()
    assert intruder.state == RefreshState.SUCCEEDED, intruder.held_reason


def test_a_scheduled_drill_skips_a_held_scope_and_runs_on_a_later_tick(fleet, source, operator):
    wrong = expected_completion_ids("v2", [5, 6, 7, 8], 4)  # what the old policy generates
    held = run_inline(source, operator, "v3", fingerprint={"completion_token_ids": wrong})
    assert held.state == RefreshState.HELD
    source.drill_every = 1
    source.save(update_fields=["drill_every"])

    # A person is told why, and nothing is recorded as a drill.
    with pytest.raises(RefreshConflict) as refused:
        start_drill(source, actor=actor_for(operator), enqueue=False)
    assert f"policy refresh #{held.pk} (held)" in refused.value.message
    # The schedule skips it, audited once however many ticks meet the held scope.
    assert drill_tick()["started"] == []
    assert drill_tick()["started"] == []
    assert not DrillRun.objects.exists()
    (skipped,) = AuditEvent.objects.filter(action="drill.skipped")
    assert f"policy refresh #{held.pk}" in skipped.details["reason"]
    assert skipped.target_id == str(source.pk)

    # The scope is freed (the held refresh rolled back); the next tick starts the drill.
    rollback = intents.rollback_policy_refresh(held, actor=actor_for(operator))
    execute_refresh(rollback.pk)
    rollback.refresh_from_db()
    assert rollback.state == RefreshState.SUCCEEDED, rollback.held_reason
    (started,) = drill_tick()["started"]
    drill = DrillRun.objects.get(pk=started)
    assert drill.scheduled and drill.outcome == DrillOutcome.RUNNING
    assert not DrillRun.objects.filter(outcome=DrillOutcome.FAILED).exists()


def test_a_drill_start_waits_for_a_refresh_start_on_the_same_source_to_commit(
    simfleet_factory, transactional_db, operator, monkeypatch
):
    """The hold is checked under one per-source lock: a drill starting while a refresh's
    start has taken the scope but not yet committed waits for it, then sees it and refuses
    (rather than both starting, each blind to the other's uncommitted row)."""
    source = verified_twice(simfleet_factory(fleet_config(6)), operator)
    refresh = plan(source, operator, "v3")
    inside, release = threading.Event(), threading.Event()
    audit = lifecycle.audit_refresh

    def paused_audit(action, *args, **kwargs):
        if action == "policy_refresh.requested":
            inside.set()  # the scope locks are inserted, the transaction is still open
            release.wait(30)
        return audit(action, *args, **kwargs)

    monkeypatch.setattr(lifecycle, "audit_refresh", paused_audit)
    outcome: dict[str, object] = {}

    def run(name, call):
        try:
            outcome[name] = call()
        except Exception as exc:  # the test reads what each start did
            outcome[name] = exc
        finally:
            connection.close()

    start = threading.Thread(
        target=run,
        args=(
            "refresh",
            lambda: intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False),
        ),
    )
    start.start()
    assert inside.wait(30)
    drill = threading.Thread(
        target=run,
        args=("drill", lambda: start_drill(source, actor=actor_for(operator), enqueue=False)),
    )
    drill.start()
    drill.join(2)
    assert drill.is_alive(), f"the drill start did not wait: {outcome.get('drill')!r}"
    release.set()
    start.join(30)
    drill.join(30)

    assert not isinstance(outcome["refresh"], Exception), outcome["refresh"]
    assert isinstance(outcome["drill"], RefreshConflict), outcome["drill"]
    assert f"policy refresh #{refresh.pk}" in outcome["drill"].message
    assert not DrillRun.objects.exists()
