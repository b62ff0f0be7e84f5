"""A worker that crashes mid-refresh never locks its scope: release, abort and retry go on without
it, a failing resume does not overrule a person's decision, and an approver can always end."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    Gate,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
    StepRun,
    WorkerStepResult,
)
from controlplane.refresh.reconcile import reconcile_policy_refreshes
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    fleet_versions,
    force_reopen_each,
    make_source,
    paused_workers,
    run_inline,
)

pytestmark = pytest.mark.django_db

UPDATE_ROUTE = "update_weights_from_disk"
RESUME_ROUTE = "resume_generation"


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet):
    return make_source(fleet)


def key_in(fleet, namespace="rl-a"):
    return next(w["key"] for w in fleet.workers() if w["namespace"] == namespace)


def run(refresh):
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    return refresh


def held_after_crash_at_update(fleet, source, operator):
    """The reported sequence: one worker's process dies while it applies the update."""
    crashed = key_in(fleet)
    instance_id = str(fleet.state(crashed)["instance_id"])
    fleet.inject(crashed, UPDATE_ROUTE, Fault.crash())
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.HELD and refresh.failed_step == "update"
    assert crashed not in {w["key"] for w in fleet.workers()}  # it left the fleet
    return refresh, refresh.workers.get(instance_id=instance_id)


def departed_at(refresh, step):
    return list(
        WorkerStepResult.objects.filter(refresh=refresh, step=step, status="departed").values_list(
            "planned_worker__key", "error"
        )
    )


def assert_scope_free_and_reusable(source, operator, fleet, refresh):
    assert not ScopeLock.objects.filter(source=source).exists()
    assert not Gate.objects.filter(active_refresh=refresh).exists()
    # A later refresh of the same namespaces starts (no refresh_conflict) and finishes.
    fleet.clear_faults()
    later = run_inline(source, operator, "v3")
    assert later.state == RefreshState.SUCCEEDED, later.held_reason
    assert set(fleet_versions(fleet).values()) == {"v3"}
    assert paused_workers(fleet) == []


def test_force_reopen_after_a_crash_mid_update_ends_and_frees_the_scope(
    fleet, source, operator, approver
):
    held, crashed = held_after_crash_at_update(fleet, source, operator)
    gate = Gate.objects.get(source=source, namespace="rl-a")

    intents.force_reopen_gate(gate, actor=actor_for(approver), reason="worker host died")
    held = run(held)
    # Only its namespace was closed out: the refresh holds again for the others.
    assert held.state == RefreshState.HELD, held.end_reason
    assert not ScopeLock.objects.filter(source=source, namespace="rl-a").exists()
    held = force_reopen_each(held, approver)

    assert held.state == RefreshState.FAILED, held.held_reason
    assert "force-reopened" in held.end_reason and "left the fleet" in held.end_reason
    assert departed_at(held, "release") == [
        (crashed.key, "left the fleet: absent from a fresh discovery of sim")
    ]
    # The dead worker was not called again; every engine that is still there runs again.
    assert not held.journal.filter(step="release", planned_worker=crashed).exists()
    assert paused_workers(fleet) == []
    gate.refresh_from_db()
    assert gate.is_open  # the person's decision stands
    departed = AuditEvent.objects.get(
        correlation_id=held.correlation_id, action="policy_refresh.workers_departed"
    )
    assert departed.details["workers"] == [crashed.key]
    assert_scope_free_and_reusable(source, operator, fleet, held)


def test_retry_after_a_crash_completes_without_the_departed_worker(
    fleet, source, operator, operator_client
):
    held, crashed = held_after_crash_at_update(fleet, source, operator)

    intents.retry_policy_refresh(held, actor=actor_for(operator))
    refresh = run(held)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert [k for k, _ in departed_at(refresh, "update")] == [crashed.key]
    # No later step called it, and the reopen did not count it as a membership change.
    later = refresh.journal.filter(planned_worker=crashed).exclude(step__in=("pause", "update"))
    assert not later.exists()
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert all(g.is_open and g.verified_version == "v2" for g in Gate.objects.filter(source=source))
    assert not ScopeLock.objects.filter(source=source).exists()
    # The refresh page shows the worker's update cell as departed, saying why.
    page = operator_client.get(f"/refreshes/{refresh.pk}/").content.decode()
    assert f'id="cell-{crashed.pk}-update" class="cell departed"' in page
    assert "left the fleet: absent from a fresh discovery of sim" in page


def test_abort_with_resume_after_a_crash_ends_without_calling_the_dead_worker(
    fleet, source, operator
):
    held, crashed = held_after_crash_at_update(fleet, source, operator)

    intents.abort_policy_refresh(held, actor=actor_for(operator), resume_engines=True)
    refresh = run(held)

    assert refresh.state == RefreshState.ABORTED, refresh.held_reason
    assert [k for k, _ in departed_at(refresh, "release")] == [crashed.key]
    assert paused_workers(fleet) == []
    assert not any(g.is_open for g in Gate.objects.filter(source=source))
    assert_scope_free_and_reusable(source, operator, fleet, refresh)


def test_a_refresh_already_held_at_release_is_released_by_a_retry(fleet, source, operator):
    # The state main left such refreshes in: held at release, trying to resume a dead worker.
    held, crashed = held_after_crash_at_update(fleet, source, operator)
    PolicyRefresh.objects.filter(pk=held.pk).update(
        failed_step="release", end_state=RefreshState.FAILED, end_reason="force-reopened"
    )

    intents.retry_policy_refresh(held, actor=actor_for(operator))
    refresh = run(held)

    assert refresh.state == RefreshState.FAILED
    assert [k for k, _ in departed_at(refresh, "release")] == [crashed.key]
    assert not ScopeLock.objects.filter(source=source).exists()


@pytest.mark.parametrize("how", ["force_reopen", "abort_with_resume"])
def test_a_listed_worker_failing_its_resume_does_not_overrule_the_decision(
    fleet, source, operator, approver, how
):
    stuck = key_in(fleet)
    fleet.inject(stuck, UPDATE_ROUTE, Fault.error("disk full"))
    fleet.inject(stuck, RESUME_ROUTE, Fault.http(503, "engine wedged"))
    held = run_inline(source, operator, "v2")
    assert held.state == RefreshState.HELD
    gate = Gate.objects.get(source=source, namespace="rl-a")

    if how == "force_reopen":
        intents.force_reopen_gate(gate, actor=actor_for(approver), reason="ship it")
        refresh = force_reopen_each(run(held), approver)
    else:
        intents.abort_policy_refresh(held, actor=actor_for(operator), resume_engines=True)
        refresh = run(held)

    expected = RefreshState.FAILED if how == "force_reopen" else RefreshState.ABORTED
    assert refresh.state == expected
    # Said, not dropped: the worker's failed resume, the release step, the end reason, the audit.
    failed = WorkerStepResult.objects.filter(
        refresh=refresh, step="release", status="failed"
    ).last()
    assert failed.planned_worker.instance_id == str(fleet.state(stuck)["instance_id"])
    assert "engine wedged" in failed.error
    assert StepRun.objects.filter(refresh=refresh, name="release").last().status == "failed"
    assert "1 engine could not be resumed" in refresh.end_reason
    assert "engine wedged" in refresh.end_reason
    ended = AuditEvent.objects.filter(correlation_id=refresh.correlation_id).latest("sequence")
    assert ended.details["engines_resumed"] is False
    assert ended.details["not_resumed"][0]["worker"] == failed.planned_worker.key
    # Only that engine is still paused; the gate is as the person left it.
    assert paused_workers(fleet) == [stuck]
    gate.refresh_from_db()
    assert gate.is_open is (how == "force_reopen")
    assert_scope_free_and_reusable(source, operator, fleet, refresh)


def test_an_approver_ends_a_held_refresh_with_a_written_reason(fleet, source, operator, approver):
    held, crashed = held_after_crash_at_update(fleet, source, operator)
    paused_before = set(paused_workers(fleet))
    assert len(paused_before) == 5
    with pytest.raises(ValidationError):
        intents.end_policy_refresh(held, actor=actor_for(approver), reason="  ")
    assert ScopeLock.objects.filter(refresh=held).exists()

    refresh = intents.end_policy_refresh(held, actor=actor_for(approver), reason="host is gone")

    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTED
    assert refresh.end_reason.startswith("ended by approver-1: host is gone")
    assert "paused left as they are" in refresh.end_reason
    assert not any(g.is_open for g in Gate.objects.filter(source=source))
    assert set(paused_workers(fleet)) == paused_before  # ending calls no worker
    event = AuditEvent.objects.get(
        correlation_id=refresh.correlation_id, action="policy_refresh.ended"
    )
    assert event.details["reason"] == "host is gone"
    assert event.details["previous_state"] == "held"
    # Ending reads nothing from the fleet: the crashed worker is named with the paused ones.
    assert len(event.details["left_paused"]) == 6 and crashed.key in event.details["left_paused"]
    with pytest.raises(InvalidTransition):
        intents.end_policy_refresh(refresh, actor=actor_for(approver), reason="again")
    assert_scope_free_and_reusable(source, operator, fleet, refresh)


def test_a_running_refresh_ends_only_once_its_executor_is_gone(fleet, source, operator, approver):
    refresh = run_inline(source, operator, "v1")  # a verified baseline
    from tests.integration.refresh.helpers import plan

    refresh = plan(source, operator, "v2")
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    assert execute_refresh(refresh.pk, stop_after="pause") == "stopped"  # executor "alive"
    with pytest.raises(InvalidTransition, match="abort it first"):
        intents.end_policy_refresh(refresh, actor=actor_for(approver), reason="stuck")

    # The executor died: its lease lapsed. Ending fences it out for good.
    PolicyRefresh.objects.filter(pk=refresh.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    token = PolicyRefresh.objects.get(pk=refresh.pk).lease_token
    intents.end_policy_refresh(refresh, actor=actor_for(approver), reason="celery is down")
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTED and refresh.lease_token == token + 1
    assert execute_refresh(refresh.pk) == "not_claimed"
    assert reconcile_policy_refreshes(resume=execute_refresh) == []
    assert_scope_free_and_reusable(source, operator, fleet, refresh)


def test_end_is_offered_on_the_page_and_the_api_to_approvers_only(
    fleet, source, operator, approver, operator_client, approver_client
):
    held, _ = held_after_crash_at_update(fleet, source, operator)
    page = approver_client.get(f"/refreshes/{held.pk}/").content.decode()
    assert f'action="/refreshes/{held.pk}/end/"' in page
    assert (
        f"/refreshes/{held.pk}/end/"
        not in operator_client.get(f"/refreshes/{held.pk}/").content.decode()
    )

    # The operator may not end it, through the page or the API.
    operator_client.post(f"/refreshes/{held.pk}/end/", {"reason": "x"})
    api = f"/api/v1/refreshes/{held.pk}/end"
    body = json.dumps({"reason": "x"})
    assert operator_client.post(api, body, content_type="application/json").status_code == 403
    held.refresh_from_db()
    assert held.state == RefreshState.HELD

    # A reason is required.
    missing = approver_client.post(
        api, json.dumps({"reason": "   "}), content_type="application/json"
    )
    assert missing.status_code == 422
    assert "written reason" in missing.json()["error"]["message"]
    answer = approver_client.post(
        api, json.dumps({"reason": "operator on leave"}), content_type="application/json"
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["state"] == "aborted"
    assert "operator on leave" in answer.json()["end_reason"]
    assert not ScopeLock.objects.filter(source=source).exists()
    # Ending twice is a state conflict, not a silent success.
    again = approver_client.post(api, body, content_type="application/json")
    assert again.status_code == 409


def test_the_end_button_on_the_page_ends_the_refresh(fleet, source, operator, approver_client):
    held, _ = held_after_crash_at_update(fleet, source, operator)
    response = approver_client.post(f"/refreshes/{held.pk}/end/", {"reason": "closing out"})
    assert response.status_code == 302
    held.refresh_from_db()
    assert held.state == RefreshState.ABORTED and "closing out" in held.end_reason
    assert not ScopeLock.objects.filter(source=source).exists()


def test_the_reconciler_frees_a_lock_whose_refresh_has_ended(fleet, source, operator):
    refresh = run_inline(source, operator, "v2")
    # A lock left behind by an end that crashed between its writes (or an older version).
    ScopeLock.objects.create(source=source, namespace="rl-a", refresh=refresh)
    Gate.objects.filter(source=source, namespace="rl-a").update(active_refresh=refresh)

    reconcile_policy_refreshes(resume=execute_refresh)

    assert not ScopeLock.objects.filter(source=source).exists()
    assert not Gate.objects.filter(active_refresh=refresh).exists()
    assert AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id,
        action="policy_refresh.recovered",
        details__released_orphaned_locks=["rl-a"],
    ).exists()
    assert run_inline(source, operator, "v3").state == RefreshState.SUCCEEDED
