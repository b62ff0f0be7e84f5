"""A `broadcast_done` is bound to one handshake attempt (one formation of the group).

After a hold and a retry that re-formed the group, the original signed `broadcast.done`
replayed inside the signature window, a re-signed copy naming the old attempt, one naming no
attempt and an API report for the old attempt are all refused: the group keeps waiting and no
worker applies. The current attempt's report still works. Simulated fleet (whose workers fail
an apply the stand-in trainer did not broadcast), real PostgreSQL, the executor in a thread.
"""

from __future__ import annotations

import json

from django.test import Client

from controlplane.audit.models import AuditEvent
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from controlplane.refresh import intents
from controlplane.refresh.intents import base
from controlplane.refresh.models import JournalEntry, PolicyRefresh, RefreshState
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.integration.refresh.helpers import actor_for, execute_in_thread, fleet_versions
from tests.integration.refresh.test_distributed_update import (
    api_client,
    big_fleet,
    distributed,
    make_source,
    plan_and_start,
    wait_until_ready,
)

VERSION = "v15"


def report(refresh_id: int, **extra) -> bytes:
    data = {"refresh_id": refresh_id, "weight_version": VERSION, **extra}
    return json.dumps({"type": "broadcast.done", "data": data}).encode()


def group_of(refresh: PolicyRefresh) -> dict:
    refresh.refresh_from_db()
    return refresh.group


def test_a_report_for_an_earlier_attempt_is_refused_after_a_retry(
    simfleet_factory, transactional_db, operator, monkeypatch
):
    fleet = big_fleet(simfleet_factory, workers=4)
    source = make_source(fleet)
    WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])
    NotificationDestination.objects.create(
        name="trainer-hook", kind="webhook", url="http://127.0.0.1:9/hook", secret=SECRET
    )
    refresh = plan_and_start(source, operator, distributed(VERSION, broadcast_timeout_s=30))
    client, auth = api_client(operator)

    # Attempt 1: the trainer reports without having broadcast, so the apply fails and holds.
    thread, done = execute_in_thread(refresh)
    first = wait_until_ready(client, auth, refresh.pk)
    # Naming no attempt is fine on the first formation: there is no earlier one to mean.
    original = report(refresh.pk)
    answer = post_webhook(Client(), original, webhook_id="msg_bcast_attempt_1")
    assert answer.status_code == 200, answer.content
    thread.join(60)
    assert done == [RefreshState.HELD]
    assert group_of(refresh)["state"] == "torn_down"

    # The retry forms the group again: attempt 2, announced with its number.
    monkeypatch.setattr(base, "enqueue_execution", lambda refresh_id: None)  # run it here instead
    refresh.refresh_from_db()
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    thread, done = execute_in_thread(refresh)
    second = wait_until_ready(client, auth, refresh.pk)
    assert second["broadcast_done_at"] is None

    # The original webhook replayed: answered from its stored delivery, nothing acts.
    replay = post_webhook(Client(), original, webhook_id="msg_bcast_attempt_1")
    assert replay.status_code == 200, replay.content
    assert replay.json()["status"] == "already_processed"
    assert ReceivedWebhook.objects.filter(webhook_id="msg_bcast_attempt_1").count() == 1
    assert group_of(refresh)["state"] == "ready"  # the group still waits for its broadcast

    # Each formation is numbered, in the group view and in the notification asking for it.
    assert (first.get("attempt"), second.get("attempt")) == (1, 2)
    announced = [
        d.payload["data"]["refresh"]["group"]["attempt"]
        for d in NotificationDelivery.objects.filter(event="refresh.group_ready").order_by("id")
    ]
    assert announced == [1, 2]
    # A re-signed copy naming attempt 1, one naming none, and the API for attempt 1: 409.
    old_attempt = report(refresh.pk, attempt=1)
    resigned = post_webhook(Client(), old_attempt, webhook_id="msg_bcast_attempt_1_again")
    assert resigned.status_code == 409, resigned.content
    assert resigned.json()["error"]["code"] == "broadcast_attempt_mismatch"
    unnamed = post_webhook(Client(), report(refresh.pk), webhook_id="msg_bcast_unnamed")
    assert unnamed.status_code == 409
    assert "name the attempt" in unnamed.json()["error"]["message"]
    api = client.post(
        f"/api/v1/refreshes/{refresh.pk}/broadcast_done",
        json.dumps({"weight_version": VERSION, "attempt": 1}),
        content_type="application/json",
        **auth,
    )
    assert api.status_code == 409, api.content
    assert api.json()["error"]["code"] == "broadcast_attempt_mismatch"

    # Nothing moved: the group waits for attempt 2's report and no worker applied.
    group = group_of(refresh)
    assert group["state"] == "ready" and group["attempt"] == 2
    assert group["broadcast_done_at"] is None
    applied = JournalEntry.objects.filter(refresh=refresh, step="update", attempt=2)
    assert not applied.exclude(planned_worker=None).exists()
    assert VERSION not in set(fleet_versions(fleet).values())
    refused = AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="policy_refresh.broadcast_refused"
    )
    assert refused.count() == 3
    assert {e.details["current_attempt"] for e in refused} == {2}
    recorded = AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="policy_refresh.broadcast_done"
    )
    assert [e.details["attempt"] for e in recorded] == [1]

    # The current attempt's report works.
    assert fleet.broadcast(VERSION) == 1
    current = post_webhook(
        Client(), report(refresh.pk, attempt=2), webhook_id="msg_bcast_attempt_2"
    )
    assert current.status_code == 200, current.content
    thread.join(60)
    refresh.refresh_from_db()
    assert done == [RefreshState.SUCCEEDED], refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {VERSION}
    assert refresh.group["state"] == "destroyed" and refresh.group["attempt"] == 2
