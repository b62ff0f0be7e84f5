"""`aborting`: what it refuses, how it shows, and that it always has an exit.

The latency of an abort under a real Celery worker with a hung worker is measured in
tests/fault/test_abort_hung_worker.py; here the executor runs in a thread of the test (or not
at all, to leave a refresh `aborting` with nobody running it).
"""

from __future__ import annotations

import json
import time

import pytest
from django.utils import timezone

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    Gate,
    JournalEntry,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
    StepRun,
    WorkerStepResult,
)
from controlplane.refresh.reconcile import orphaned_refresh_ids, reconcile_policy_refreshes
from controlplane.simfleet import Fault
from tests.integration.refresh.cli import cli, cli_json
from tests.integration.refresh.helpers import (
    actor_for,
    execute_in_thread,
    fleet_config,
    make_source,
    paused_workers,
    plan,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

UPDATE_ROUTE = "update_weights_from_disk"
WORKERS = 3


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(WORKERS))


def started(fleet, operator, name: str = "sim") -> PolicyRefresh:
    refresh = plan(make_source(fleet, name=name), operator, "v2")
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    return refresh


def aborting_without_executor(fleet, operator) -> PolicyRefresh:
    """Paused by an executor that then died (its lease left to expire), then aborted."""
    refresh = started(fleet, operator)
    assert execute_refresh(refresh.pk, stop_after="pause") == "stopped"
    intents.abort_policy_refresh(refresh, actor=actor_for(operator))
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTING
    return refresh


def test_an_aborting_refresh_refuses_a_second_abort_a_retry_and_an_end_clearly(
    fleet, operator, approver, operator_client, approver_client
):
    refresh = aborting_without_executor(fleet, operator)
    api = f"/api/v1/refreshes/{refresh.pk}"
    again = operator_client.post(f"{api}/abort", json.dumps({}), "application/json")
    assert again.status_code == 409, again.content
    assert "already aborting" in again.json()["error"]["message"]
    retry = operator_client.post(f"{api}/retry", "", "application/json")
    assert retry.status_code == 409, retry.content
    assert "is aborting" in retry.json()["error"]["message"]
    with pytest.raises(InvalidTransition, match="is aborting: its executor is cancelling"):
        intents.end_policy_refresh(refresh, actor=actor_for(approver), reason="stuck")
    code, _, err = cli("refresh", "abort", str(refresh.pk), "--as", operator.username)
    assert code != 0 and "already aborting" in err
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTING
    # Exactly one abort was recorded.
    aborted = AuditEvent.objects.filter(action="policy_refresh.aborted", target_id=str(refresh.pk))
    assert aborted.count() == 1
    assert aborted.get().details["state"] == RefreshState.ABORTING


def test_aborting_shows_in_the_refresh_and_gate_apis(fleet, operator, operator_client):
    refresh = aborting_without_executor(fleet, operator)
    answer = operator_client.get(f"/api/v1/refreshes/{refresh.pk}")
    assert answer.status_code == 200 and answer.json()["state"] == "aborting"
    listed = operator_client.get("/api/v1/refreshes?state=aborting")
    assert listed.status_code == 200, listed.content
    assert [r["id"] for r in listed.json()["items"]] == [refresh.pk]
    for gate in Gate.objects.filter(active_refresh=refresh):
        shown = operator_client.get(f"/api/v1/gates/{refresh.source.name}/{gate.namespace}")
        assert shown.status_code == 200, shown.content
        body = shown.json()
        assert body["state"] == "closed" and body["active_refresh_id"] == refresh.pk
        assert f"policy refresh #{refresh.pk} aborting" in body["reason"]
    code, out, _ = cli("refresh", "status", str(refresh.pk))
    assert code == 0 and "state: aborting" in out
    page = operator_client.get(f"/refreshes/{refresh.pk}/")
    assert page.status_code == 200
    assert 'class="badge aborting"' in page.content.decode()
    code, status = cli_json("refresh", "status", str(refresh.pk))
    assert code == 0 and status["eta"]["estimated_end"] is None
    assert "aborting" in status["eta"]["reason"]


def test_the_reconciler_finishes_an_abort_whose_executor_died(fleet, operator, settings):
    refresh = aborting_without_executor(fleet, operator)
    # Still the dead executor's: nothing is resumed before its lease expires.
    assert refresh.pk not in orphaned_refresh_ids()
    PolicyRefresh.objects.filter(pk=refresh.pk).update(
        lease_expires_at=timezone.now() - timezone.timedelta(seconds=1)
    )
    assert reconcile_policy_refreshes(resume=execute_refresh) == [refresh.pk]
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTED and refresh.finished_at is not None
    assert refresh.end_reason.startswith(f"aborted by {actor_for(operator).label}")
    assert f"{WORKERS} workers this refresh paused left paused" in refresh.end_reason
    assert not ScopeLock.objects.filter(refresh=refresh).exists()
    assert not any(g.is_open for g in Gate.objects.filter(source=refresh.source))
    # The workers stay paused for the recovery that follows, and nothing else was called.
    assert len(paused_workers(fleet)) == WORKERS
    assert not JournalEntry.objects.filter(refresh=refresh, step="update").exists()
    confirmed = AuditEvent.objects.filter(
        action="policy_refresh.aborted", target_id=str(refresh.pk), actor_label__contains="executor"
    ).get()
    assert confirmed.details["left_paused"] and confirmed.details["cancelled_calls"] == 0
    # A second tick finds nothing to do.
    assert reconcile_policy_refreshes(resume=execute_refresh) == []


def test_abort_with_resume_cancels_then_resumes_the_engines(fleet, operator, settings):
    settings.REFRESH_CALL_TIMEOUT_SECONDS = 30.0
    refresh = started(fleet, operator)
    hung = fleet.workers()[0]["key"]
    fleet.inject(hung, UPDATE_ROUTE, Fault.hang(600, once=True))
    thread, done = execute_in_thread(refresh)
    try:
        wait_for(lambda: UPDATE_ROUTE not in fleet.state(hung)["faults"])
        asked = time.monotonic()
        intents.abort_policy_refresh(refresh, actor=actor_for(operator), resume_engines=True)
    finally:
        thread.join(60)
    took = time.monotonic() - asked
    assert done == [RefreshState.ABORTED], done
    assert took < 10, took  # the release resumes every engine, the hung one included
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTED
    assert StepRun.objects.get(refresh=refresh, name="update").status == "aborted"
    assert WorkerStepResult.objects.filter(
        refresh=refresh, step="update", status="cancelled"
    ).exists()
    release = StepRun.objects.get(refresh=refresh, name="release")
    assert release.status == "ok", release.detail
    assert paused_workers(fleet) == []
    assert not ScopeLock.objects.filter(refresh=refresh).exists()
