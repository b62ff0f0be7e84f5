"""What a drill refuses before touching anything: an active refresh on the scope, no earlier
verified policy, a viewer, a subset that would empty a namespace."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents
from controlplane.refresh.drills.actions import start_drill
from controlplane.refresh.errors import InvalidTransition, RefreshConflict
from controlplane.refresh.models import DrillRun, RefreshState
from controlplane.refresh.tasks import drill_tick
from tests.integration.drills.helpers import actor_for, verified_twice
from tests.integration.refresh.helpers import fleet_config, make_source, plan, run_inline

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet, operator):
    return verified_twice(fleet, operator)


def test_a_drill_is_refused_while_a_refresh_is_active_and_the_schedule_skips_it(
    fleet, source, operator
):
    source.require_approval = True
    source.drill_every = 1
    source.save(update_fields=["require_approval", "drill_every"])
    waiting = plan(source, operator, "v3")
    intents.start_policy_refresh(waiting, actor=actor_for(operator), enqueue=False)
    waiting.refresh_from_db()
    assert waiting.state == RefreshState.AWAITING_APPROVAL

    with pytest.raises(RefreshConflict) as refused:
        start_drill(source, actor=actor_for(operator), enqueue=False)
    assert f"policy refresh #{waiting.pk}" in refused.value.message
    assert drill_tick()["started"] == []
    assert not DrillRun.objects.exists()


def test_a_second_drill_is_refused_while_one_runs(fleet, source, operator):
    first = start_drill(source, actor=actor_for(operator), enqueue=False)
    with pytest.raises(RefreshConflict) as refused:
        start_drill(source, actor=actor_for(operator), enqueue=False)
    assert f"#{first.pk}" in refused.value.message


def test_nothing_to_roll_back_to(fleet, operator):
    source = make_source(fleet)
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    with pytest.raises(InvalidTransition, match="nothing to roll back to"):
        start_drill(source, actor=actor_for(operator), enqueue=False)


def test_a_scheduled_drill_that_cannot_start_is_recorded_failed(fleet, operator):
    source = make_source(fleet, drill_every=1)
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    assert drill_tick()["started"] == []
    drill = DrillRun.objects.get(source=source)
    assert drill.outcome == "failed" and "nothing to roll back to" in drill.reason
    assert drill_tick()["started"] == []  # not due again until its interval
    assert DrillRun.objects.filter(source=source).count() == 1


def test_a_viewer_may_not_drill(fleet, source, viewer):
    with pytest.raises(PermissionDenied):
        start_drill(source, actor=actor_for(viewer), enqueue=False)


def test_a_drill_keeps_a_worker_of_each_namespace_serving(fleet, source, operator):
    with pytest.raises(ValidationError, match="leave none serving"):
        start_drill(source, actor=actor_for(operator), count=2, enqueue=False)


def test_starting_a_drill_is_audited(fleet, source, operator):
    drill = start_drill(source, actor=actor_for(operator), enqueue=False)
    event = AuditEvent.objects.get(action="drill.started")
    assert event.details["drill_id"] == drill.pk
    assert event.details["to_version"] == "v1" and event.details["from_version"] == "v2"
    assert event.actor_label == operator.get_username()
