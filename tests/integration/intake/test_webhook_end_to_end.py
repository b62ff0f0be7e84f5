"""A trainer's signed "checkpoint ready" webhook drives a policy refresh on the simulated fleet,
executed by a real Celery worker: auto-start, replay, and the approval-required variant.

Waiting is bounded polling on database state (the refresh's own journal), never a fixed sleep.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from controlplane.audit.recorder import Actor
from controlplane.fleet import services as fleet_services
from controlplane.intake import services
from controlplane.intake.models import ReceivedWebhook, WebhookPolicy
from controlplane.refresh import intents
from controlplane.refresh.gates import gate_state
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.integration.intake.conftest import post_webhook

pytestmark = pytest.mark.celery

NAMESPACES = ("rl-a", "rl-b")
FINISHED = {RefreshState.SUCCEEDED, RefreshState.HELD, RefreshState.FAILED, RefreshState.ABORTED}


def wait_for[T](predicate: Callable[[], T], *, timeout: float = 60.0, what: str = "") -> T:
    """Poll the database until `predicate` is truthy; fail with what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def checkpoint(version: str) -> bytes:
    return json.dumps(
        {
            "type": "checkpoint.ready",
            "data": {
                "weight_version": version,
                "model_path": f"/checkpoints/run-7/{version}",
                "step": 1200,
                "metrics": {"eval/reward": 0.61},
            },
        }
    ).encode()


@pytest.fixture
def wired(simfleet, celery_worker):
    """A source over the simulated fleet and an endpoint for it; returns (source, endpoint,
    secret). Built through the same services the admin pages use."""
    system = Actor.system("test setup")
    source = fleet_services.create_source(
        actor=system,
        name="sim",
        listener_url=simfleet.listener_url,
        frontend_url=simfleet.frontend_url,
        expected_prefix="rl",
        allowed_networks=["127.0.0.0/8"],
    )

    def make(policy=WebhookPolicy.AUTO_START):
        endpoint, secret = services.create_webhook_endpoint(
            actor=system, name="trainer-run-7", source=source, policy=policy
        )
        return source, endpoint, secret

    return make


def delivered(viewer_client, webhook_id: str) -> dict:
    """Wait for the background task to give the delivery an outcome; read it over the API."""

    def done():
        response = viewer_client.get(f"/api/v1/webhooks/deliveries/{webhook_id}")
        assert response.status_code == 200, response.content
        return response.json() if response.json()["terminal"] else None

    return wait_for(done, what=f"delivery {webhook_id} to be processed")


def finished(refresh_id: int) -> PolicyRefresh | None:
    refresh = PolicyRefresh.objects.get(pk=refresh_id)
    return refresh if refresh.state in FINISHED else None


def assert_rolled_out(simfleet, source, version: str) -> None:
    keys = [w["key"] for w in simfleet.workers()]
    assert len(keys) == 4
    assert {simfleet.state(key)["version"] for key in keys} == {version}
    for namespace in NAMESPACES:
        gate = gate_state(source, namespace)
        assert gate["open"] is True, gate
        assert gate["verified_version"] == version, gate
        assert gate["active_refresh_id"] is None, gate


def test_signed_checkpoint_webhook_refreshes_the_fleet_and_a_replay_starts_nothing(
    client, simfleet, wired, viewer_client
):
    source, endpoint, secret = wired(WebhookPolicy.AUTO_START)
    body = checkpoint("step-1200")

    response = post_webhook(
        client, body, secret=secret, webhook_id="msg_e2e_1", endpoint=endpoint.name
    )
    assert response.status_code == 202, response.content
    assert response.json()["outcome"] == "accepted"
    answer = delivered(viewer_client, "msg_e2e_1")
    assert answer["outcome"] == "started"
    refresh = wait_for(lambda: finished(answer["refresh_id"]), what="the policy refresh to finish")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert sorted(refresh.namespaces) == list(NAMESPACES)
    assert_rolled_out(simfleet, source, "step-1200")

    # Same webhook id again (a trainer retry): answered from memory, nothing new starts.
    replay = post_webhook(
        client, body, secret=secret, webhook_id="msg_e2e_1", endpoint=endpoint.name
    )
    assert replay.status_code == 200
    assert replay.json()["status"] == "already_processed"
    assert replay.json()["refresh_id"] == refresh.pk
    assert PolicyRefresh.objects.count() == 1
    assert ReceivedWebhook.objects.filter(endpoint=endpoint).count() == 1


def test_approval_required_refresh_waits_for_an_approver_then_succeeds(
    client, simfleet, wired, approver, viewer_client
):
    # The source itself does not require approval: the endpoint's policy alone asks for it.
    source, endpoint, secret = wired(WebhookPolicy.REQUIRE_APPROVAL)
    assert not source.require_approval

    response = post_webhook(
        client,
        checkpoint("step-1300"),
        secret=secret,
        webhook_id="msg_e2e_2",
        endpoint=endpoint.name,
    )
    assert response.status_code == 202, response.content
    answer = delivered(viewer_client, "msg_e2e_2")
    assert answer["outcome"] == "awaiting_approval"
    refresh = PolicyRefresh.objects.get(pk=answer["refresh_id"])
    assert refresh.state == RefreshState.AWAITING_APPROVAL
    # Nothing touched the fleet while waiting.
    assert {simfleet.state(w["key"])["update_count"] for w in simfleet.workers()} == {0}

    intents.approve_policy_refresh(refresh, actor=Actor.for_user(approver))
    refresh = wait_for(lambda: finished(refresh.pk), what="the approved refresh to finish")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert refresh.approved_by == approver
    assert_rolled_out(simfleet, source, "step-1300")
