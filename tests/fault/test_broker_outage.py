"""Webhooks accepted while Redis is down are not lost: a trainer's signed `checkpoint.ready`
deliveries are answered 202 (stored, `queued: false`) while the broker is killed, and once it
is back the delivery sweep (beat, in a real Celery worker process) enqueues every one, oldest
first: none is left `queued`, and for each scope the newest accepted checkpoint is the one that
starts while the older ones are superseded by it, as if no outage had happened."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from channels.layers import get_channel_layer
from django.core.cache import cache

from controlplane.audit.recorder import Actor
from controlplane.fleet import services as fleet_services
from controlplane.intake import services
from controlplane.intake.models import DeliveryState, ReceivedWebhook, WebhookPolicy
from controlplane.intake.models import ReceivedWebhookOutcome as Outcome
from tests.fixtures.broker import killable_redis, product_on, wait_until, worker_process
from tests.integration.intake.conftest import post_webhook

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

SCOPES = ("rl-a", "rl-b")
PER_SCOPE = 3
SWEEP_SECONDS = 1.0
#: From Redis's return to every delivery done: a sweep interval and grace, a discovery and a
#: plan per scope, with room for a loaded machine.
RECOVERY_BOUND_SECONDS = 45.0


@pytest.fixture
def redis_server(tmp_path):
    with killable_redis(tmp_path / "redis") as server:
        yield server


def checkpoint(version: str, namespace: str) -> bytes:
    data = {
        "weight_version": version,
        "model_path": f"/checkpoints/run-7/{version}",
        "step": 1200,
        "namespaces": [namespace],
    }
    return json.dumps({"type": "checkpoint.ready", "data": data}).encode()


async def _roundtrip(layer) -> dict:
    channel = await layer.new_channel()
    await layer.group_add("outage-check", channel)
    try:
        await layer.group_send("outage-check", {"type": "outage.check"})
        return await asyncio.wait_for(layer.receive(channel), 10)
    finally:
        await layer.group_discard("outage-check", channel)


def test_the_channel_layer_reconnects_after_a_redis_restart(redis_server, settings, fault_report):
    with product_on(redis_server, settings):
        layer = get_channel_layer()

        async def around_a_restart() -> tuple[dict, dict, int]:
            before = await _roundtrip(layer)
            await asyncio.to_thread(redis_server.restart)  # kill -9, then the same port again
            # Pub/sub is best effort (settings.py, CHANNEL_LAYERS): what is sent while a
            # connection is re-established may fail; the same layer must work again soon.
            deadline = time.monotonic() + 10
            failures = 0
            while True:
                try:
                    return before, await _roundtrip(layer), failures
                except Exception:
                    failures += 1
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)

        before, after, failures = asyncio.run(around_a_restart())
    assert before["type"] == after["type"] == "outage.check"
    fault_report(sends_failed_after_restart=failures)
    assert failures <= 3, failures


def test_checkpoints_accepted_during_a_redis_outage_are_all_processed_in_order(
    client, simfleet, redis_server, settings, tmp_path, fault_report
):
    system = Actor.system("test setup")
    source = fleet_services.create_source(
        actor=system,
        name="sim",
        listener_url=simfleet.listener_url,
        frontend_url=simfleet.frontend_url,
        expected_prefix="rl",
        allowed_networks=["127.0.0.0/8"],
    )
    # Approval required: a started refresh waits for a person, so the figures measure intake,
    # not the rollout.
    endpoint, secret = services.create_webhook_endpoint(
        actor=system, name="trainer-run-7", source=source, policy=WebhookPolicy.REQUIRE_APPROVAL
    )
    settings.WEBHOOK_SWEEP_SECONDS = SWEEP_SECONDS
    sent: list[tuple[str, str]] = []  # (webhook id, scope) in the order they were accepted
    with (
        product_on(redis_server, settings),
        worker_process(
            redis_server.url, tmp_path / "worker.log", beat=True, WEBHOOK_SWEEP_SECONDS="1"
        ) as worker,
    ):
        redis_server.kill()
        for step in range(PER_SCOPE):
            for scope in SCOPES:
                webhook_id = f"msg_outage_{scope}_{step}"
                body = checkpoint(f"step-{step}-{scope}", scope)
                answer = post_webhook(
                    client, body, secret=secret, webhook_id=webhook_id, endpoint=endpoint.name
                )
                assert answer.status_code == 202, answer.content
                assert answer.json()["state"] == DeliveryState.QUEUED
                assert answer.json()["queued"] is False, answer.json()
                assert "sweep" in answer.json()["recovery"]
                sent.append((webhook_id, scope))

        redis_server.start()
        back = time.monotonic()

        def all_done() -> bool:
            pending = ReceivedWebhook.objects.filter(endpoint=endpoint).exclude(
                state=DeliveryState.DONE
            )
            return not pending.exists()

        wait_until(all_done, timeout=RECOVERY_BOUND_SECONDS, what="every delivery to be done")
        recovered_in = round(time.monotonic() - back, 1)
        assert worker.poll() is None
        # The product's own Redis clients came back with it.
        cache.set("after-the-outage", "ok", 30)
        assert cache.get("after-the-outage") == "ok"

    deliveries = {d.webhook_id: d for d in ReceivedWebhook.objects.filter(endpoint=endpoint)}
    assert len(deliveries) == len(sent) == PER_SCOPE * len(SCOPES)
    lost = [w for w, d in deliveries.items() if d.state != DeliveryState.DONE]
    for scope in SCOPES:
        in_order = [w for w, s in sent if s == scope]
        newest = deliveries[in_order[-1]]
        assert newest.outcome == Outcome.AWAITING_APPROVAL, (newest.outcome, newest.detail)
        assert newest.refresh_id is not None
        for older in in_order[:-1]:
            delivery = deliveries[older]
            assert delivery.outcome == Outcome.SUPERSEDED, (older, delivery.outcome)
            superseder = delivery.detail.removeprefix("superseded by webhook ").split()[0]
            assert in_order.index(superseder) > in_order.index(older), delivery.detail
    fault_report(
        deliveries=len(sent),
        lost_deliveries=len(lost),
        left_queued=sum(d.state == DeliveryState.QUEUED for d in deliveries.values()),
        recovered_in_s=recovered_in,
        bound_s=RECOVERY_BOUND_SECONDS,
    )
