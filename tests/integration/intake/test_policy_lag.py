"""Policy lag (issue 23, item 6): a trainer's `policy.published` (and `checkpoint.ready` with a
step) are recorded as facts, the gate API shows how far behind the admitted workers serve, and
a `max_lag=close` source closes its gate as `stale_policy` once the trainer is two steps past
the serving version, through a real Celery worker, until a refresh brings it back."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import PublishedPolicy
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from controlplane.refresh import stale_policy
from controlplane.refresh.models import Gate, GateState, RefreshState
from tests.fixtures.broker import wait_until
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.integration.refresh.helpers import fleet_config, make_source, run_inline

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def published(step: int, *, webhook_id: str, **data) -> bytes:
    body = {
        "type": "policy.published",
        "data": {
            "step": step,
            "weight_version": f"step-{step}",
            "checkpoint_digest": f"sha256:{step:064x}",
            **data,
        },
    }
    return json.dumps(body).encode()


def gate_api(secret: str, namespace: str) -> dict:
    answer = Client().get(f"/api/v1/gates/sim/{namespace}", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert answer.status_code == 200, answer.content
    return answer.json()


def test_a_close_source_closes_as_stale_policy_and_reopens_after_a_refresh(
    simfleet_factory, operator, viewer, celery_worker
):
    fleet = simfleet_factory(fleet_config(4))
    source = make_source(fleet, max_lag_action="close", max_lag_steps=1)
    WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])
    _, secret = create_token(user=viewer, label="rollouts", actor=Actor.system("test"))
    client = Client()

    assert (
        post_webhook(client, published(300, webhook_id="p300"), webhook_id="p300").status_code
        == 200
    )
    refresh = run_inline(source, operator, "step-300")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    namespaces = sorted(refresh.namespaces)
    for namespace in namespaces:
        lag = gate_api(secret, namespace)["policy_lag"]
        assert (lag["steps"], lag["exceeded"], lag["serving_step"]) == (0, False, 300)

    # One step ahead: within bounds, shown, nothing closes.
    assert (
        post_webhook(client, published(301, webhook_id="p301"), webhook_id="p301").status_code
        == 200
    )
    assert stale_policy.enforce(source.pk) == []
    lag = gate_api(secret, namespaces[0])["policy_lag"]
    assert (lag["steps"], lag["exceeded"], lag["latest_version"]) == (1, False, "step-301")

    # Two steps past the serving version: the worker's task closes every gate of the source.
    answer = post_webhook(client, published(302, webhook_id="p302"), webhook_id="p302")
    assert answer.status_code == 200 and answer.json()["created"] is True
    wait_until(
        lambda: not Gate.objects.filter(source=source).exclude(state=GateState.CLOSED).exists(),
        timeout=60,
        what="the stale_policy close",
    )
    for namespace in namespaces:
        gate = gate_api(secret, namespace)
        assert gate["state"] == "closed" and not gate["open"]
        assert gate["reason"].startswith("stale_policy: serving step-300"), gate["reason"]
        assert (gate["policy_lag"]["steps"], gate["policy_lag"]["exceeded"]) == (2, True)

    # A refresh to the latest policy reopens them, within bounds, and they stay open.
    after = run_inline(source, operator, "step-302")
    assert after.state == RefreshState.SUCCEEDED, after.held_reason
    assert stale_policy.enforce(source.pk) == []
    for namespace in namespaces:
        gate = gate_api(secret, namespace)
        assert gate["state"] == "open" and gate["verified_version"] == "step-302"
        assert (gate["policy_lag"]["steps"], gate["policy_lag"]["exceeded"]) == (0, False)
    stored = ReceivedWebhook.objects.filter(event_type="policy.published")
    assert sorted(stored.values_list("outcome", flat=True)) == ["policy_published"] * 3


def test_publications_only_move_forward(source, endpoint):
    client = Client()
    assert post_webhook(client, published(10, webhook_id="a"), webhook_id="a").status_code == 200
    # The same fact again, from another delivery: the same row.
    again = post_webhook(client, published(10, webhook_id="b"), webhook_id="b")
    assert again.status_code == 200 and again.json()["created"] is False, again.json()
    # A repeat of a delivery is answered as stored.
    assert post_webhook(client, published(10, webhook_id="a"), webhook_id="a").status_code == 200
    # Older than the latest, a version seen at another step, another digest for a step: 409.
    older = post_webhook(client, published(9, webhook_id="c"), webhook_id="c")
    assert older.status_code == 409 and older.json()["error"]["code"] == "not_monotonic"
    reused = published(11, webhook_id="d", weight_version="step-10")
    assert post_webhook(client, reused, webhook_id="d").status_code == 409
    other_digest = published(10, webhook_id="e", checkpoint_digest="sha256:other")
    assert post_webhook(client, other_digest, webhook_id="e").status_code == 409
    # A separate lineage is its own sequence.
    assert (
        post_webhook(
            client, published(5, webhook_id="f", lineage="run-2"), webhook_id="f"
        ).status_code
        == 200
    )
    bad = published(12, webhook_id="g", weight_version="")
    assert post_webhook(client, bad, webhook_id="g").status_code == 422
    assert list(
        PublishedPolicy.objects.order_by("lineage", "step").values_list("lineage", "step")
    ) == [
        ("", 10),
        ("run-2", 5),
    ]
