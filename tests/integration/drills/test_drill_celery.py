"""Drills through a real Celery worker and Redis: the task's poll chain, the schedule, and the
beat reconciler resuming a drill whose task died between its two directions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.refresh.drills.actions import start_drill
from controlplane.refresh.drills.runner import advance
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import DrillOutcome, DrillPhase, DrillRun, RefreshState
from controlplane.refresh.tasks import drill_tick
from tests.integration.drills.helpers import actor_for, verified_sets, verified_twice
from tests.integration.refresh.helpers import fleet_config, fleet_versions, wait_for


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet, operator, celery_worker):
    return verified_twice(fleet, operator)


def ended(drill: DrillRun) -> DrillRun:
    def done():
        drill.refresh_from_db()
        return not drill.is_running

    wait_for(done, timeout=90, interval=0.2)
    return drill


def test_a_drill_runs_through_celery_and_proves_rollback(fleet, source, operator):
    before = verified_sets(source)
    drill = ended(start_drill(source, actor=actor_for(operator)))

    assert drill.outcome == DrillOutcome.SUCCEEDED, drill.reason
    assert drill.forward_refresh.state == drill.back_refresh.state == RefreshState.SUCCEEDED
    assert drill.forward_seconds > 0 and drill.back_seconds > 0
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert verified_sets(source) == before


def test_the_schedule_starts_a_due_drill_and_not_one_that_is_not_due(fleet, source, operator):
    source.drill_every = 6
    source.save(update_fields=["drill_every"])

    started = drill_tick()["started"]
    assert len(started) == 1
    drill = ended(DrillRun.objects.get(pk=started[0]))
    assert drill.scheduled and drill.outcome == DrillOutcome.SUCCEEDED, drill.reason
    assert drill.requested_by is None and "schedule" in drill.requested_by_label

    # Not due again until six hours after it began.
    assert drill_tick()["started"] == []
    DrillRun.objects.filter(pk=drill.pk).update(started_at=timezone.now() - timedelta(hours=7))
    again = drill_tick()["started"]
    assert len(again) == 1 and again[0] != drill.pk
    assert ended(DrillRun.objects.get(pk=again[0])).outcome == DrillOutcome.SUCCEEDED


class WorkerDied(Exception):
    pass


def test_the_reconciler_resumes_a_drill_whose_task_died_between_directions(
    fleet, source, operator, settings
):
    drill = start_drill(source, actor=actor_for(operator), enqueue=False)

    def forward_then_die(refresh_id: int) -> None:
        execute_refresh(refresh_id)
        raise WorkerDied

    with pytest.raises(WorkerDied):
        advance(drill.pk, execute=forward_then_die)
    drill.refresh_from_db()
    assert drill.is_running and drill.phase == DrillPhase.FORWARD
    assert drill.forward_refresh.state == RefreshState.SUCCEEDED
    assert drill.back_refresh is None

    # Not yet silent long enough: left alone.
    assert drill_tick()["resumed"] == []
    DrillRun.objects.filter(pk=drill.pk).update(
        updated_at=timezone.now() - timedelta(seconds=settings.DRILL_STALL_SECONDS + 1)
    )
    assert drill_tick()["resumed"] == [drill.pk]

    drill = ended(drill)
    assert drill.outcome == DrillOutcome.SUCCEEDED, drill.reason
    assert drill.forward_seconds > 0 and drill.back_seconds > 0
    assert set(fleet_versions(fleet).values()) == {"v2"}
