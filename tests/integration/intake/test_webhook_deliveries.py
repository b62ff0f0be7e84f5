"""A delivery's life after the 202: transient failures are retried and stay retryable by the
trainer, only a terminal outcome is `already_processed`, and the deliveries endpoint tells the
truth to whoever may read it (and to nobody else).

The background task is driven directly (`process_delivery`), one attempt at a time.
"""

from __future__ import annotations

import json

import pytest
from django.db import OperationalError
from django.test import Client

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint, WebhookPolicy
from controlplane.intake.webhooks.trainer.process import process_delivery
from controlplane.refresh import intents
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.integration.intake.conftest import SECRET, post_webhook

BODY = json.dumps(
    {"type": "checkpoint.ready", "data": {"weight_version": "step-9", "model_path": "/c/9"}}
).encode()


@pytest.fixture
def auto_endpoint(endpoint):
    endpoint.policy = WebhookPolicy.AUTO_START
    endpoint.save()
    return endpoint


def token(role: Role, name: str, sources=()) -> dict:
    user = create_user_with_role(name, role, "pw-not-used-1234", validate=False)
    _, secret = create_token(user=user, label=name, actor=Actor.system(), sources=sources)
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def delivery(client, webhook_id: str, auth: dict, **query):
    return client.get(f"/api/v1/webhooks/deliveries/{webhook_id}", query, **auth)


def test_a_transient_failure_is_retried_then_left_retryable_and_a_repeat_runs_it_again(
    settings, auto_endpoint, monkeypatch
):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    client, viewer = Client(), token(Role.VIEWER, "reader")
    first = post_webhook(client, BODY, webhook_id="msg_t1")
    assert first.status_code == 202
    assert first.json()["outcome"] == "accepted" and first.json()["state"] == "queued"
    received = ReceivedWebhook.objects.get(webhook_id="msg_t1")

    # The listener (127.0.0.1:9) is unreachable: no fresh discovery, a transient failure.
    assert process_delivery(received.pk) == pytest.approx(settings.WEBHOOK_RETRY_BASE_SECONDS)
    state = delivery(client, "msg_t1", viewer).json()
    assert (state["state"], state["terminal"], state["attempts"]) == ("retrying", False, 1)
    assert "discovery" in state["last_error"]
    # The plan the attempt made could not start: it was aborted, not left behind.
    assert set(PolicyRefresh.objects.values_list("state", flat=True)) == {RefreshState.ABORTED}

    # A repeat while it is being retried is not `already_processed`.
    repeat = post_webhook(client, BODY, webhook_id="msg_t1")
    assert (repeat.status_code, repeat.json()["status"]) == (202, "pending")

    # A deadlock is transient too; the attempts run out and the delivery stays retryable.
    def deadlock(*args, **kwargs):
        raise OperationalError("deadlock detected")

    monkeypatch.setattr(intents, "plan_policy_refresh", deadlock)
    assert process_delivery(received.pk) is None
    state = delivery(client, "msg_t1", viewer).json()
    assert (state["state"], state["outcome"], state["attempts"]) == ("retryable", None, 2)
    assert state["last_error"] == "database: deadlock detected"

    # The trainer's retry with the same id re-runs it (it is not `already_processed`) ...
    monkeypatch.undo()
    rerun = post_webhook(client, BODY, webhook_id="msg_t1")
    assert (rerun.status_code, rerun.json()["status"], rerun.json()["state"]) == (
        202,
        "accepted",
        "queued",
    )
    received.refresh_from_db()
    assert received.attempt_limit == 2 + settings.WEBHOOK_MAX_ATTEMPTS
    # ... and once it reaches a terminal outcome, a repeat is answered from memory.
    monkeypatch.setattr(intents, "plan_policy_refresh", _blocked_plan)
    assert process_delivery(received.pk) is None
    done = post_webhook(client, BODY, webhook_id="msg_t1")
    assert (done.status_code, done.json()["status"]) == (200, "already_processed")
    assert done.json()["outcome"] == "plan_blocked"
    state = delivery(client, "msg_t1", viewer).json()
    assert (state["state"], state["terminal"], state["outcome"]) == ("done", True, "plan_blocked")
    assert state["refresh_id"] == done.json()["refresh_id"]


def _blocked_plan(
    *,
    source,
    actor,
    target,
    namespaces=None,
    pause_mode="keep",
    fingerprint=None,
    strategy=None,
    inflight_may_straddle=False,
):
    """A plan with a permanent blocker (a worker without the route), on a fresh discovery."""
    from django.utils import timezone

    from controlplane.fleet.models import DiscoveryRun

    run = DiscoveryRun.objects.create(
        source=source, trigger="plan", started_at=timezone.now(), ok=True
    )
    return PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a"],
        target=target,
        plan_blockers=["1 of 1 workers have blockers"],
        discovery_run=run,
    )


def test_a_signed_repeat_with_a_different_body_is_refused(endpoint):
    client = Client()
    assert post_webhook(client, BODY, webhook_id="msg_b").status_code == 202
    other = BODY.replace(b"step-9", b"step-10")
    response = post_webhook(client, other, webhook_id="msg_b")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "webhook_id_reused"
    assert ReceivedWebhook.objects.get(webhook_id="msg_b").payload["data"]["weight_version"] == (
        "step-9"
    )


def test_the_deliveries_endpoint_needs_a_reader_and_respects_source_limits(endpoint, source):
    client = Client()
    assert post_webhook(client, BODY, webhook_id="msg_v").status_code == 202
    other_source = Source.objects.create(
        name="src-b", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    WebhookEndpoint.objects.create(name="trainer-b", source=other_source, secrets=[SECRET])
    assert post_webhook(client, BODY, webhook_id="msg_v", endpoint="trainer-b").status_code == 202

    assert delivery(client, "msg_v", {}).status_code == 401
    viewer = token(Role.VIEWER, "reader")
    ambiguous = delivery(client, "msg_v", viewer)
    assert ambiguous.status_code == 409
    assert ambiguous.json()["error"]["details"] == {"endpoints": ["trainer-a", "trainer-b"]}
    assert delivery(client, "msg_v", viewer, endpoint="trainer-b").json()["source"] == "src-b"
    limited = token(Role.VIEWER, "limited", sources=[source])
    answer = delivery(client, "msg_v", limited)  # only trainer-a's is visible to it
    assert answer.status_code == 200
    assert (answer.json()["endpoint"], answer.json()["state"]) == ("trainer-a", "queued")
    assert delivery(client, "msg_v", limited, endpoint="trainer-b").status_code == 404
    assert delivery(client, "msg_unknown", viewer).status_code == 404


def test_the_deliveries_endpoint_is_in_the_openapi_schema(client):
    schema = client.get("/api/v1/openapi.json").json()
    operation = schema["paths"]["/api/v1/webhooks/deliveries/{webhook_id}"]["get"]
    assert {"200", "401", "404", "409"} <= set(operation["responses"])
