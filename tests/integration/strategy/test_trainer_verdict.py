"""The canary's evaluation gate end to end, with a real Celery worker and Redis: a trainer's
signed `checkpoint.ready` starts a canary refresh (the endpoint's default strategy), the canary
is verified, a test trainer receives the signed `refresh.canary_review` notification and
answers over a signed `canary.verdict` webhook built only from what the notification said.

Passed: the rest of the scope follows and the refresh succeeds. Failed: only the canary is
rolled back, and the refresh holds. Waiting is bounded polling on real state, never a sleep.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client

from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.intake import services
from controlplane.intake.models import ReceivedWebhook, WebhookPolicy
from controlplane.notify.models import NotificationDestination
from controlplane.notify.signing import VerificationError, sign_headers, verify
from controlplane.refresh.models import JournalEntry, PolicyRefresh, RefreshState
from tests.integration.refresh.helpers import (
    fleet_config,
    fleet_versions,
    make_source,
    paused_workers,
    run_inline,
    wait_for,
)
from tests.integration.strategy.helpers import gates_of

pytestmark = pytest.mark.celery

NOTIFY_SECRET = "whsec_" + base64.b64encode(b"n" * 32).decode()
CANARY = {
    "kind": "canary",
    "canary": {"size": 2, "evaluation": "trainer", "timeout_seconds": 600},
    "max_unavailable": 3,
}
FINISHED = {RefreshState.SUCCEEDED, RefreshState.HELD, RefreshState.FAILED, RefreshState.ABORTED}


class TestTrainer:
    """A trainer's notification receiver: keeps every correctly signed notification, refuses
    (401) anything else, and answers a canary review over the control plane's trainer webhook."""

    __test__ = False

    def __init__(self, endpoint_name: str, webhook_secret: str) -> None:
        self.endpoint_name = endpoint_name
        self.webhook_secret = webhook_secret
        self.received: list[dict[str, Any]] = []
        self.refused = 0
        trainer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    verify([NOTIFY_SECRET], headers, body, tolerance_seconds=300)
                except VerificationError:
                    trainer.refused += 1
                    self.send_response(401)
                else:
                    trainer.received.append(json.loads(body))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/notifications"

    def review(self) -> dict[str, Any] | None:
        for message in self.received:
            if message["type"] == "refresh.canary_review":
                return message["data"]["refresh"]["canary"]
        return None

    def answer(self, review: dict[str, Any], *, passed: bool, webhook_id: str, **extra):
        """The verdict as the notification asks for it: its event, refresh and version."""
        body = json.dumps(
            {
                "type": review["answer"]["webhook_event"],
                "data": {
                    "refresh_id": review["refresh_id"],
                    "weight_version": review["weight_version"],
                    "passed": passed,
                    **extra,
                },
            }
        ).encode()
        signed = sign_headers(self.webhook_secret, webhook_id, body)
        meta = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed.items()}
        return Client().post(
            f"/api/v1/webhooks/trainer/{self.endpoint_name}",
            body,
            content_type="application/json",
            **meta,
        )

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(8))


@pytest.fixture
def wired(fleet, celery_worker, operator):
    """A source at v1, an auto-start endpoint whose default strategy is a trainer-judged
    canary, and the trainer listening for the canary review."""
    source = make_source(fleet)
    first = run_inline(source, operator, "v1")
    assert first.state == RefreshState.SUCCEEDED, first.held_reason
    system = Actor.system("test setup")
    endpoint, secret = services.create_webhook_endpoint(
        actor=system,
        name="trainer-run-7",
        source=source,
        policy=WebhookPolicy.AUTO_START,
        default_strategy=CANARY,
    )
    trainer = TestTrainer(endpoint.name, secret)
    NotificationDestination.objects.create(
        name="trainer-run-7",
        kind="webhook",
        url=trainer.url,
        secret=NOTIFY_SECRET,
        allowed_networks=["127.0.0.0/8"],
        events=["refresh.canary_review"],
        source=source,
    )
    yield source, endpoint, secret, trainer
    trainer.close()


def checkpoint(client, endpoint, secret, version: str):
    body = json.dumps(
        {
            "type": "checkpoint.ready",
            "data": {"weight_version": version, "model_path": f"/checkpoints/run-7/{version}"},
        }
    ).encode()
    signed = sign_headers(secret, f"msg_ckpt_{version}", body)
    meta = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed.items()}
    response = client.post(
        f"/api/v1/webhooks/trainer/{endpoint.name}", body, content_type="application/json", **meta
    )
    assert response.status_code == 202, response.content


def canary_under_review(fleet, trainer) -> tuple[PolicyRefresh, dict[str, Any]]:
    review = wait_for(trainer.review, timeout=90)
    refresh = PolicyRefresh.objects.get(pk=review["refresh_id"])
    assert refresh.state == RefreshState.CANARY_REVIEW
    canary_ids = set(refresh.workers.filter(wave=1).values_list("instance_id", flat=True))
    # What the trainer was told: the canary's verified instances, the version, the deadline,
    # and where to answer.
    assert {i for ids in review["instances"].values() for i in ids} == canary_ids
    assert len(canary_ids) == 2
    assert review["weight_version"] == "v2"
    assert review["deadline"] == refresh.progress["canary"]["deadline"]
    assert review["answer"]["api"].endswith(f"/api/v1/refreshes/{refresh.pk}/canary_verdict")
    assert trainer.refused == 0
    # While it waits, the canary serves v2 and everyone else still v1; nothing is paused.
    versions = {w["instance_id"]: w["version"] for w in fleet.workers()}
    assert {str(i) for i, v in versions.items() if v == "v2"} == canary_ids
    assert paused_workers(fleet) == []
    return refresh, review


def finished(pk: int) -> PolicyRefresh | None:
    refresh = PolicyRefresh.objects.get(pk=pk)
    return refresh if refresh.state in FINISHED else None


def test_a_canary_passed_by_the_trainer_over_a_signed_webhook_proceeds(client, fleet, wired):
    source, endpoint, secret, trainer = wired
    checkpoint(client, endpoint, secret, "v2")
    refresh, review = canary_under_review(fleet, trainer)
    assert refresh.strategy["kind"] == "canary"  # the endpoint's default strategy

    answer = trainer.answer(review, passed=True, webhook_id="msg_verdict_1", metrics={"r": 0.9})
    assert answer.status_code == 200, answer.content
    assert answer.json()["outcome"] == "canary_verdict"

    refresh = wait_for(lambda: finished(refresh.pk), timeout=90)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}
    gates = gates_of(source)
    assert all(g.state == "open" and g.verified_version == "v2" for g in gates.values())
    assert sum(len(g.verified_instances) for g in gates.values()) == 8
    assert refresh.progress["canary"]["metrics"] == {"r": 0.9}
    assert refresh.progress["canary"]["by"] == "webhook:trainer-run-7"

    delivery = ReceivedWebhook.objects.get(endpoint=endpoint, webhook_id="msg_verdict_1")
    assert (delivery.outcome, delivery.refresh_id) == ("canary_verdict", refresh.pk)
    # The trainer's retry of the same delivery is answered from memory and changes nothing.
    replay = trainer.answer(review, passed=True, webhook_id="msg_verdict_1", metrics={"r": 0.9})
    assert replay.status_code == 200
    assert replay.json()["status"] == "already_processed"
    passed = AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="policy_refresh.canary_passed"
    )
    assert passed.count() == 1


def test_a_canary_failed_by_the_trainer_rolls_back_only_the_canary_and_holds(client, fleet, wired):
    source, endpoint, secret, trainer = wired
    checkpoint(client, endpoint, secret, "v2")
    refresh, review = canary_under_review(fleet, trainer)
    canary_ids = {i for ids in review["instances"].values() for i in ids}

    answer = trainer.answer(
        review, passed=False, webhook_id="msg_verdict_2", reason="reward fell", metrics={"r": 0.1}
    )
    assert answer.status_code == 200, answer.content

    refresh = wait_for(lambda: finished(refresh.pk), timeout=90)
    assert refresh.state == RefreshState.HELD
    assert "reward fell" in refresh.held_reason
    # Only the canary was ever paused, and it is back on v1 with everyone else.
    paused = set(
        JournalEntry.objects.filter(refresh=refresh, step="pause").values_list(
            "planned_worker__instance_id", flat=True
        )
    )
    assert paused == canary_ids
    assert set(fleet_versions(fleet).values()) == {"v1"}
    assert paused_workers(fleet) == []
    gates = gates_of(source)
    assert all(g.state == "open" and g.verified_version == "v1" for g in gates.values())
    assert sum(len(g.verified_instances) for g in gates.values()) == 8
    # A late opposite answer is refused and changes nothing.
    late = trainer.answer(review, passed=True, webhook_id="msg_verdict_3")
    assert late.status_code == 409
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.HELD
