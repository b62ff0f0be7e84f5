"""A quarantined worker's exits — retry, release, drop — as operator actions on the worker page,
the JSON API and `manage.py quarantine`, with real Redis and Celery on the simulated fleet; a
catch-up whose Celery worker died is picked up by the reconciler beat; drift notifications.

Each surface runs the same action-table row: permission-checked (a viewer gets 403 / exit 1 and
nothing changes), audited as the person acting, refused with a reason (changing nothing) when
the quarantine's state does not allow the exit.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from controlplane.accounts.management.commands._cli import Exit
from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.accounts.tokens import create_token
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Worker, WorkerState
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from controlplane.refresh import quarantine as quarantines
from controlplane.refresh import tasks
from controlplane.refresh.models import GateState, Quarantine, QuarantineState
from controlplane.simfleet import Fault
from tests.integration.drift.test_drift_quarantine import (
    UPDATE_ROUTE,
    detected_within_two_discoveries,
    discover,
    gate,
    refreshed,
    restart_one,
)
from tests.integration.refresh.helpers import make_source, wait_for

#: A worker's pause route, whichever family it is (a fault on a route it lacks never fires).
PAUSE_ROUTES = ("pause_generation", "control/pause_generation")


@pytest.fixture(autouse=True)
def short_calls(settings):
    settings.REFRESH_CALL_TIMEOUT_SECONDS = 5.0


@pytest.fixture
def fleet(simfleet_factory):
    from tests.integration.refresh.helpers import fleet_config

    return simfleet_factory(fleet_config(6))


@pytest.fixture
def drift_hook(transactional_db):
    """A destination subscribed to the drift events (allowed nowhere: we read its deliveries)."""
    return NotificationDestination.objects.create(
        name="drift-hook",
        kind="slack",
        url="https://hooks.example.invalid/drift",
        allowed_networks=[],
        events=["drift.quarantined", "drift.admitted", "drift.failed"],
    )


def notified(event: str, q: Quarantine) -> list[dict]:
    return [
        d.payload
        for d in NotificationDelivery.objects.filter(event=event)
        if d.payload["data"].get("quarantine", {}).get("id") == q.pk
    ]


def audited(action: str, q: Quarantine) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, correlation_id=q.correlation_id))


def failed_quarantine(fleet, operator, routes=(UPDATE_ROUTE,), fault=None):
    """After a refresh to v2 a worker restarts on base weights and its catch-up fails."""
    source = refreshed(fleet, operator)
    _, new_id = restart_one(fleet)
    for route in routes:
        fleet.inject(new_id, route, fault or Fault.http(500, "disk read failed"))
    q = detected_within_two_discoveries(
        source,
        lambda: Quarantine.objects.filter(instance_id=new_id, state=QuarantineState.FAILED).first(),
    )
    return source, new_id, q


def bearer(role: Role, name: str, sources=()) -> dict:
    user = create_user_with_role(name, role, "pw-not-used-1234", validate=False)
    _, secret = create_token(user=user, label=name, actor=Actor.system(), sources=sources)
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


# -- the worker page --------------------------------------------------------------------------


def test_exits_on_the_worker_page(
    fleet, operator, operator_client, viewer_client, drift_hook, celery_worker
):
    source, new_id, q = failed_quarantine(fleet, operator)
    worker = Worker.objects.get(source=source, instance_id=new_id)
    page_url = reverse("fleet:worker", args=[worker.pk])
    retry_url = reverse("refresh:quarantine_retry", args=[q.pk])
    release_url = reverse("refresh:quarantine_release", args=[q.pk])
    drop_url = reverse("refresh:quarantine_drop", args=[q.pk])

    page = operator_client.get(page_url).content.decode()
    assert retry_url in page and release_url in page
    assert drop_url not in page  # the worker is still there: drop is no exit for it
    assert retry_url not in viewer_client.get(page_url).content.decode()

    # A viewer may not act: 403, nothing changes, nothing audited.
    for url in (retry_url, release_url, drop_url):
        assert viewer_client.post(url, {"reason": "x", "confirm": "1"}).status_code == 403
    q.refresh_from_db()
    assert q.state == QuarantineState.FAILED and q.attempts == 1
    assert not audited("quarantine.retried", q) and not audited("quarantine.released", q)

    # Release needs its confirmation ticked; then it is refused: the readback is not v2.
    answer = operator_client.post(release_url, {"reason": "need capacity"}, follow=True)
    assert "Tick the confirmation" in answer.content.decode()
    answer = operator_client.post(
        release_url, {"reason": "need capacity", "confirm": "1"}, follow=True
    )
    assert "wrong policy" in answer.content.decode()
    q.refresh_from_db()
    assert q.state == QuarantineState.FAILED and fleet.state(new_id)["paused"] is True
    assert not audited("quarantine.released", q)

    # Drop is refused while the worker is present.
    answer = operator_client.post(drop_url, {"confirm": "1"}, follow=True)
    assert "still in the fleet" in answer.content.decode()

    # With the disk fixed, retry from the page catches it up and admits it.
    fleet.clear_faults(new_id)
    answer = operator_client.post(retry_url)
    assert answer.status_code == 302 and answer["Location"] == page_url
    wait_for(
        lambda: Quarantine.objects.filter(pk=q.pk, state=QuarantineState.ADMITTED).exists(),
        timeout=30,
    )
    assert new_id in gate(source).verified_instances
    [retried] = audited("quarantine.retried", q)
    assert retried.actor_label == operator.get_username()

    # Every step was notified, with the quarantine named.
    [opened] = notified("drift.quarantined", q)
    assert opened["data"]["quarantine"]["instance_id"] == new_id
    assert opened["data"]["source"]["name"] == source.name
    assert "disk read failed" in notified("drift.failed", q)[0]["data"]["reason"]
    [admitted] = notified("drift.admitted", q)
    assert admitted["data"]["quarantine"]["state"] == "admitted"
    assert admitted["data"]["quarantine"]["link"].endswith(f"/api/v1/quarantines/{q.pk}")


# -- the JSON API -------------------------------------------------------------------------------


def test_exits_over_the_api_respect_permissions_and_source_limits(fleet, operator, celery_worker):
    source, new_id, q = failed_quarantine(fleet, operator, ("generate",), Fault.wrong_tokens())
    other = make_source(fleet, name="other")
    client = Client()
    ops = bearer(Role.OPERATOR, "ops")
    viewer = bearer(Role.VIEWER, "reader")
    elsewhere = bearer(Role.OPERATOR, "elsewhere", sources=[other])
    base = f"/api/v1/quarantines/{q.pk}"

    listed = client.get("/api/v1/quarantines", {"source": "sim", "state": "failed"}, **viewer)
    assert [item["id"] for item in listed.json()["items"]] == [q.pk]
    shown = client.get(base, **viewer).json()
    assert shown["instance_id"] == new_id and shown["state"] == "failed"
    assert ("verify", "agreement") in {(c["step"], c["operation"]) for c in shown["journal"]}
    bad_state = client.get("/api/v1/quarantines", {"state": "nonsense"}, **viewer)
    assert bad_state.status_code == 422 and bad_state.json()["error"]["code"] == "validation_error"

    # A token limited to another source sees nothing of this one.
    assert client.get("/api/v1/quarantines", **elsewhere).json()["count"] == 0
    assert client.get(base, **elsewhere).status_code == 404
    refused = client.post(f"{base}/retry", **elsewhere)
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"

    # A viewer may read but not act.
    forbidden = client.post(
        f"{base}/release", {"reason": "x"}, content_type="application/json", **viewer
    )
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
    assert client.post(f"{base}/drop", **viewer).status_code == 403

    # Release needs a reason; drop is refused while the worker is there (409, nothing changes).
    no_reason = client.post(f"{base}/release", {}, content_type="application/json", **ops)
    assert no_reason.status_code == 422
    conflict = client.post(f"{base}/drop", **ops)
    assert conflict.status_code == 409
    assert "still in the fleet" in conflict.json()["error"]["message"]
    q.refresh_from_db()
    assert q.state == QuarantineState.FAILED and fleet.state(new_id)["paused"] is True

    # Retry: queued again, fails the same cross-check again (the fault is still there).
    retried = client.post(f"{base}/retry", **ops)
    assert retried.status_code == 200 and retried.json()["state"] in ("quarantined", "catching_up")
    wait_for(
        lambda: Quarantine.objects.filter(
            pk=q.pk, state=QuarantineState.FAILED, attempts=2
        ).exists(),
        timeout=30,
    )
    # Release: its readback is v2, so it may serve (outside the verified set).
    released = client.post(
        f"{base}/release",
        {"reason": "investigating <b>this</b>"},
        content_type="application/json",
        **ops,
    )
    assert released.status_code == 200, released.content
    assert released.json()["state"] == "released" and released.json()["paused"] is False
    assert fleet.state(new_id)["paused"] is False
    assert new_id not in gate(source).verified_instances
    [event] = audited("quarantine.released", q)
    assert event.actor_label == "token:ops (ops)"
    assert "investigating <b>this</b>" in event.details["reason"]
    # A released quarantine is no longer held: retry is a conflict, not a second catch-up.
    again = client.post(f"{base}/retry", **ops)
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"


# -- the command line ---------------------------------------------------------------------------


def run_cli(*args) -> tuple[int, str, str]:
    from io import StringIO

    out, err = StringIO(), StringIO()
    try:
        call_command("quarantine", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), err.getvalue()


def test_exits_on_the_command_line(fleet, operator, viewer, drift_hook, celery_worker):
    # A worker that cannot be paused closes its gate: its quarantine fails and, once the
    # worker has left, discovery no longer reconciles that gate — drop is the way out.
    source, new_id, q = failed_quarantine(
        fleet, operator, PAUSE_ROUTES, Fault.http(500, "engine busy")
    )
    assert gate(source).state == GateState.CLOSED and new_id in gate(source).reason
    assert notified("drift.failed", q)

    code, out, _ = run_cli("list", "sim")
    assert code == 0 and f"{q.pk}\tsim\trl-a" in out and "failed" in out
    code, out, _ = run_cli("list", "sim", "--json")
    listed = json.loads(out)
    assert listed["ok"] is True and [item["id"] for item in listed["quarantines"]] == [q.pk]
    code, out, _ = run_cli("show", str(q.pk))
    assert code == 0 and f'"instance_id": "{new_id}"' in out and '"pause"' in out
    assert run_cli("show", "999999")[0] == Exit.NOT_FOUND

    me = operator.get_username()
    before = (q.state, q.reason, q.attempts, q.updated_at)
    code, _, err = run_cli("retry", str(q.pk), "--as", viewer.get_username())
    assert code == Exit.NOT_PERMITTED and "may not" in err
    assert run_cli("retry", str(q.pk), "--as", "nobody")[0] == Exit.NOT_PERMITTED
    code, _, err = run_cli("release", str(q.pk), "--as", me, "--reason", "capacity")
    assert code == Exit.CONFLICT and "wrong policy" in err  # still reads back the base weights
    code, _, err = run_cli("drop", str(q.pk), "--as", me)
    assert code == Exit.CONFLICT and "still in the fleet" in err
    q.refresh_from_db()
    assert (q.state, q.reason, q.attempts, q.updated_at) == before  # refusals change nothing
    assert not audited("quarantine.retried", q) and not audited("quarantine.dropped", q)

    # Retry runs it again (the pause still fails), audited as the operator.
    code, out, _ = run_cli("retry", str(q.pk), "--as", me)
    assert code == 0 and "queued again" in out
    wait_for(lambda: len(audited("quarantine.failed", q)) == 2, timeout=30)
    q.refresh_from_db()
    assert q.state == QuarantineState.FAILED and "engine busy" in q.reason
    assert audited("quarantine.retried", q)[0].actor_label == me

    # The worker leaves; the closed gate is not reconciled, so the quarantine stays: drop it.
    fleet.remove_worker(new_id)
    discover(source)
    wait_for(lambda: Worker.objects.filter(instance_id=new_id, state=WorkerState.GONE).exists())
    q.refresh_from_db()
    assert q.state == QuarantineState.FAILED
    code, _, err = run_cli("drop", str(q.pk), "--as", viewer.get_username())
    assert code == Exit.NOT_PERMITTED
    code, out, _ = run_cli("drop", str(q.pk), "--as", me)
    assert code == 0, out
    q.refresh_from_db()
    assert q.state == QuarantineState.DROPPED and q.finished_at is not None
    [dropped] = audited("quarantine.dropped", q)
    assert dropped.actor_label == me


# -- a catch-up whose Celery worker died ---------------------------------------------------------


def test_stalled_catch_up_is_requeued_by_the_reconciler(fleet, operator, settings, celery_worker):
    settings.QUARANTINE_STALL_SECONDS = 60.0
    source, new_id, q = failed_quarantine(fleet, operator)
    fleet.clear_faults(new_id)
    # A runner claims the catch-up (as `catch_up` does first) and its Celery worker dies.
    assert quarantines.claim(q)
    assert q.state == QuarantineState.CATCHING_UP and q.attempts == 2
    dead = quarantines.Heartbeat(q.pk, q.attempts)
    assert dead.touch()

    # While its heartbeat is fresh it is left alone: it may still be running.
    tasks.reconcile_policy_refreshes()
    q.refresh_from_db()
    assert q.state == QuarantineState.CATCHING_UP and not audited("quarantine.requeued", q)
    assert not Quarantine.objects.filter(quarantines.stalled(), pk=q.pk).exists()

    # Its heartbeat goes silent past the stall time: the beat queues it again, a live Celery
    # worker catches it up and admits it — nobody had to act.
    silent_since = timezone.now() - timedelta(seconds=settings.QUARANTINE_STALL_SECONDS + 1)
    Quarantine.objects.filter(pk=q.pk).update(heartbeat_at=silent_since)
    tasks.reconcile_policy_refreshes()
    [requeued] = audited("quarantine.requeued", q)
    assert requeued.details["previous_state"] == "catching_up"
    q = wait_for(
        lambda: Quarantine.objects.filter(pk=q.pk, state=QuarantineState.ADMITTED).first(),
        timeout=30,
    )
    assert q.attempts == 3 and new_id in gate(source).verified_instances
    # The dead runner's attempt is fenced: its heartbeat no longer matches the row.
    assert not dead.touch()


def test_queued_catch_up_never_picked_up_is_requeued(fleet, operator, settings, celery_worker):
    settings.QUARANTINE_STALL_SECONDS = 60.0
    source, new_id, q = failed_quarantine(fleet, operator)
    fleet.clear_faults(new_id)
    assert not quarantines.requeue_stalled(q)  # failed: waiting for a person, not stalled
    # A retry was queued but its task was lost with the broker: the row sits `quarantined`.
    Quarantine.objects.filter(pk=q.pk).update(
        state=QuarantineState.QUARANTINED,
        reason="retry queued",
        updated_at=timezone.now() - timedelta(seconds=61),
    )
    tasks.reconcile_policy_refreshes()
    q = wait_for(
        lambda: Quarantine.objects.filter(pk=q.pk, state=QuarantineState.ADMITTED).first(),
        timeout=30,
    )
    [requeued] = audited("quarantine.requeued", q)
    assert requeued.details["previous_state"] == "quarantined"
    assert new_id in gate(source).verified_instances
