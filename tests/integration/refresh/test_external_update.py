"""External updates on the simulated fleet: the trainer's framework applies the weights itself.

The refresh pauses, announces `refresh.ready_for_apply` with the worker set and waits in
`awaiting_apply` with no executor; the test trainer loads the weights through each worker's
own route (as verl's CUDA IPC or NeMo RL's refit would, outside the control plane) without
declaring a version, and reports `applied`. Only then does the refresh declare the version,
read it back, flush, verify and reopen. A report that never comes holds at the deadline with
the workers paused and owned by the held refresh; a report for another version, an unknown
refresh or instance, or a refresh that waits for none is refused and changes nothing.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import httpx
import pytest
from django.test import Client
from django.urls import reverse

from controlplane.accounts.tokens import create_token
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.intake.models import WebhookEndpoint
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from controlplane.refresh import drift, intents, quarantine
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.intents.external import expire_apply_waits
from controlplane.refresh.models import (
    Gate,
    JournalEntry,
    PolicyRefresh,
    Quarantine,
    QuarantineState,
    RefreshState,
    ScopeLock,
)
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    fleet_versions,
    make_source,
    paused_workers,
    plan,
    sync_workers,
)

VERSION = "ext-7"


def external(version=VERSION, **extra):
    return {"weight_version": version, "method": "external", **extra}


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(3))


@pytest.fixture
def source(fleet, transactional_db):
    source = make_source(fleet)
    WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])
    NotificationDestination.objects.create(
        name="trainer-hook", kind="webhook", url="http://127.0.0.1:9/hook", secret=SECRET
    )
    return source


def api(user) -> tuple[Client, dict]:
    _, secret = create_token(user=user, label="trainer", actor=Actor.system())
    return Client(), {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def post_applied(client, auth, refresh_id, body):
    return client.post(
        f"/api/v1/refreshes/{refresh_id}/applied",
        json.dumps(body),
        content_type="application/json",
        **auth,
    )


def webhook_applied(data, webhook_id):
    body = json.dumps({"type": "refresh.applied", "data": data}).encode()
    return post_webhook(Client(), body, webhook_id=webhook_id)


def start_and_wait(source, user, target) -> PolicyRefresh:
    """Plan, start and run the executor until it gives the refresh up to wait."""
    refresh = plan(source, user, target=target)
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(user), enqueue=False)
    assert execute_refresh(refresh.pk) == RefreshState.AWAITING_APPLY
    refresh.refresh_from_db()
    return refresh


def apply_out_of_band(workers, model_path):
    """The framework's own transfer: each worker's update route, called by the trainer, with
    no version declared (the control plane declares it afterwards)."""
    for worker in workers:
        reply = httpx.post(
            f"{worker['system_url']}/engine/update_weights_from_disk",
            json={"model_path": model_path},
            timeout=10,
        )
        assert reply.json()["status"] == "ok", reply.text


def snapshot(refresh):
    refresh.refresh_from_db()
    return (refresh.state, refresh.progress, refresh.failed_step, refresh.held_reason)


def test_external_update_waits_for_the_report_then_declares_verifies_and_reopens(
    fleet, source, operator
):
    before = fleet_versions(fleet)
    refresh = start_and_wait(source, operator, external())

    # Paused and announced; no update route was called, and no executor holds it.
    assert sorted(paused_workers(fleet)) == sorted(w["key"] for w in fleet.workers())
    calls = JournalEntry.objects.filter(refresh=refresh, step="update")
    assert not calls.exclude(operation="discovery").exists()
    assert refresh.lease_expires_at is None and refresh.lease_owner == ""
    assert all(w.update_method == "external" for w in refresh.workers.all())
    (note,) = NotificationDelivery.objects.filter(event="refresh.ready_for_apply")
    announced = note.payload["data"]["refresh"]["external"]
    assert announced["refresh_id"] == refresh.pk and announced["weight_version"] == VERSION
    assert announced["answer"]["webhook_event"] == "refresh.applied"
    workers = announced["workers"]
    assert {w["instance_id"] for w in workers} == {str(w["instance_id"]) for w in fleet.workers()}
    assert all(w["system_url"] and w["namespace"] for w in workers)

    page = Client()
    page.force_login(operator)
    shown = page.get(reverse("refresh:detail", args=[refresh.pk]))
    assert shown.status_code == 200
    assert 'id="apply-wait"' in shown.content.decode()
    assert "0 of 3 reported" in shown.content.decode()

    apply_out_of_band(workers, f"/ckpt/{VERSION}")
    assert fleet_versions(fleet) == before  # loaded, but no version declared yet

    # One worker over the API, then the rest (and the first again) over the signed webhook.
    client, auth = api(operator)
    first = workers[0]["instance_id"]
    answer = post_applied(
        client, auth, refresh.pk, {"weight_version": VERSION, "instance_ids": [first]}
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["state"] == RefreshState.AWAITING_APPLY
    view = client.get(f"/api/v1/refreshes/{refresh.pk}/external", **auth).json()
    assert view["applied"] == [first] and len(view["missing"]) == 2

    answer = webhook_applied({"refresh_id": refresh.pk, "weight_version": VERSION}, "msg_all")
    assert answer.status_code == 200, answer.content
    assert answer.json()["outcome"] == "applied"
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.UPDATING

    assert execute_refresh(refresh.pk) == RefreshState.SUCCEEDED
    refresh.refresh_from_db()
    assert set(fleet_versions(fleet).values()) == {VERSION}
    assert paused_workers(fleet) == []
    ops = list(
        JournalEntry.objects.filter(refresh=refresh, step="update")
        .exclude(operation="discovery")
        .values_list("operation", "ok")
    )
    assert sorted(ops) == sorted(
        [("set_weight_version", True)] * 3 + [("get_weight_version", True)] * 3
    )
    for gate in Gate.objects.filter(source=source):
        assert gate.state == "open" and gate.verified_version == VERSION
    audited = list(
        AuditEvent.objects.filter(correlation_id=refresh.correlation_id).values_list(
            "action", flat=True
        )
    )
    assert audited.count("policy_refresh.ready_for_apply") == 1
    assert audited.count("policy_refresh.applied") == 2
    assert "policy_refresh.succeeded" in audited
    assert refresh.compat["update_method"] == "external"


def test_a_drifted_worker_is_not_caught_up_to_an_external_policy_without_the_trainer(
    fleet, source, operator
):
    refresh = start_and_wait(source, operator, external())
    client, auth = api(operator)
    assert post_applied(client, auth, refresh.pk, {"weight_version": VERSION}).status_code == 200
    assert execute_refresh(refresh.pk) == RefreshState.SUCCEEDED

    # A worker restarts at base weights: declaring the version alone would admit old weights.
    key = sorted(w["key"] for w in fleet.workers())[0]
    new_id = fleet.restart(key)
    sync_workers(source)
    opened = drift.reconcile_source(source.pk)
    assert opened
    for quarantine_id in opened:
        quarantine.catch_up(quarantine_id)
    (q,) = Quarantine.objects.filter(instance_id=str(new_id))
    assert q.state == QuarantineState.FAILED
    assert "applied by the trainer's framework" in q.reason
    assert (
        not JournalEntry.objects.filter(operation="set_weight_version")
        .exclude(refresh=refresh)
        .exists()
    )
    assert fleet.state(new_id)["version"] != VERSION


def test_a_report_that_never_comes_holds_with_the_workers_paused_and_owned(fleet, source, operator):
    refresh = start_and_wait(source, operator, external(apply_timeout_s=30))
    deadline = datetime.fromisoformat(refresh.progress["external"]["deadline"])
    workers = refresh.progress["external"]["workers"]
    client, auth = api(operator)
    reported = workers[0]["instance_id"]
    answer = post_applied(
        client, auth, refresh.pk, {"weight_version": VERSION, "instance_ids": [reported]}
    )
    assert answer.status_code == 200, answer.content

    assert expire_apply_waits(now=deadline - timedelta(seconds=1)) == []
    assert expire_apply_waits(now=deadline + timedelta(seconds=1)) == [refresh.pk]

    refresh.refresh_from_db()
    assert refresh.state == RefreshState.HELD and refresh.failed_step == "update"
    missing = sorted(w["instance_id"] for w in workers[1:])
    assert "did not report applied within 30 s" in refresh.held_reason
    assert all(i in refresh.held_reason for i in missing)
    assert reported not in refresh.held_reason
    # Still paused, still the held refresh's: its scope locks and its closed gates.
    assert len(paused_workers(fleet)) == 3
    assert ScopeLock.objects.filter(refresh=refresh).count() == len(refresh.namespaces)
    for gate in Gate.objects.filter(source=source):
        assert gate.state == "closed" and gate.active_refresh_id == refresh.pk
    assert sorted(intents.left_paused_keys(refresh)) == sorted(w["key"] for w in workers)
    # A late report is refused: the refresh no longer waits for one.
    late = post_applied(client, auth, refresh.pk, {"weight_version": VERSION})
    assert late.status_code == 409 and late.json()["error"]["code"] == "not_awaiting_apply"

    # Retry announces again (attempt 2) to every worker; a full report then finishes it.
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    assert execute_refresh(refresh.pk) == RefreshState.AWAITING_APPLY
    refresh.refresh_from_db()
    assert refresh.progress["external"]["attempt"] == 2
    assert len(refresh.progress["external"]["workers"]) == 3
    apply_out_of_band(refresh.progress["external"]["workers"], f"/ckpt/{VERSION}")
    answer = post_applied(client, auth, refresh.pk, {"weight_version": VERSION})
    assert answer.status_code == 200, answer.content
    assert execute_refresh(refresh.pk) == RefreshState.SUCCEEDED
    assert set(fleet_versions(fleet).values()) == {VERSION}


def test_refused_reports_change_nothing(fleet, source, operator, viewer):
    refresh = start_and_wait(source, operator, external())
    client, auth = api(operator)
    before = snapshot(refresh)
    ids = [w["instance_id"] for w in refresh.progress["external"]["workers"]]

    wrong = post_applied(client, auth, refresh.pk, {"weight_version": "ext-6"})
    assert wrong.status_code == 409
    assert wrong.json()["error"]["code"] == "weight_version_mismatch"
    hooked = webhook_applied({"refresh_id": refresh.pk, "weight_version": "ext-6"}, "msg_w")
    assert hooked.status_code == 409
    assert hooked.json()["error"]["code"] == "weight_version_mismatch"

    stranger = post_applied(
        client, auth, refresh.pk, {"weight_version": VERSION, "instance_ids": ["12345"]}
    )
    assert stranger.status_code == 409
    assert stranger.json()["error"]["code"] == "instance_not_in_refresh"

    unknown = post_applied(client, auth, 987654, {"weight_version": VERSION})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    hooked = webhook_applied({"refresh_id": 987654, "weight_version": VERSION}, "msg_u")
    assert hooked.status_code == 404 and hooked.json()["error"]["code"] == "unknown_refresh"

    _, view_secret = create_token(user=viewer, label="viewer", actor=Actor.system())
    denied = post_applied(
        client,
        {"HTTP_AUTHORIZATION": f"Bearer {view_secret}"},
        refresh.pk,
        {"weight_version": VERSION},
    )
    assert denied.status_code == 403

    assert snapshot(refresh) == before
    assert len(paused_workers(fleet)) == 3
    refused = AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="policy_refresh.applied_refused"
    )
    assert {e.details["code"] for e in refused} == {
        "weight_version_mismatch",
        "instance_not_in_refresh",
    }

    # A report recorded once changes nothing the second time.
    for _ in range(2):
        answer = post_applied(
            client, auth, refresh.pk, {"weight_version": VERSION, "instance_ids": ids[:1]}
        )
        assert answer.status_code == 200, answer.content
    applied = AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="policy_refresh.applied"
    )
    assert applied.count() == 1


def test_a_refresh_that_waits_for_no_report_refuses_one(fleet, source, operator):
    refresh = plan(source, operator, target={**external(), "weight_version": "ext-8"})
    client, auth = api(operator)
    answer = post_applied(client, auth, refresh.pk, {"weight_version": "ext-8"})
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "not_awaiting_apply"
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.PLANNED


def test_abort_while_waiting_holds_or_releases(fleet, source, operator):
    refresh = start_and_wait(source, operator, external())
    intents.abort_policy_refresh(refresh, actor=actor_for(operator))
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.HELD and refresh.failed_step == "update"
    assert "aborted by" in refresh.held_reason
    assert len(paused_workers(fleet)) == 3

    intents.abort_policy_refresh(refresh, actor=actor_for(operator), resume_engines=True)
    assert execute_refresh(refresh.pk) == RefreshState.ABORTED
    assert paused_workers(fleet) == []
