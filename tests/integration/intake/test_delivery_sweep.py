"""The delivery sweep: which stored deliveries it enqueues again (their task was lost), in
which order, that a second sweep does not send them twice, and that a duplicate task is
harmless because one claim takes a delivery."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from controlplane import jobs
from controlplane.intake.models import DeliveryState, ReceivedWebhook
from controlplane.intake.webhooks.trainer import process
from controlplane.intake.webhooks.trainer.events import CHECKPOINT_READY

pytestmark = pytest.mark.django_db


def delivery(endpoint, webhook_id: str, state=DeliveryState.QUEUED, age_s=0.0, **fields):
    row = ReceivedWebhook.objects.create(
        endpoint=endpoint,
        webhook_id=webhook_id,
        event_type=CHECKPOINT_READY,
        payload={"type": CHECKPOINT_READY, "data": {}},
        state=state,
        **fields,
    )
    # `updated_at` is auto_now: age it with an UPDATE, as time would.
    ReceivedWebhook.objects.filter(pk=row.pk).update(
        updated_at=timezone.now() - timedelta(seconds=age_s),
        received_at=timezone.now() - timedelta(seconds=age_s),
    )
    return row


def test_the_sweep_takes_lost_deliveries_oldest_first_and_only_once(endpoint, settings):
    settings.WEBHOOK_SWEEP_SECONDS = 10.0
    newer = delivery(endpoint, "msg_newer", age_s=20)
    older = delivery(endpoint, "msg_older", age_s=60)
    delivery(endpoint, "msg_fresh", age_s=1)  # its task may still be on its way
    overdue = delivery(
        endpoint,
        "msg_retry",
        DeliveryState.RETRYING,
        age_s=40,
        next_attempt_at=timezone.now() - timedelta(seconds=30),
    )
    delivery(
        endpoint,
        "msg_retry_later",
        DeliveryState.RETRYING,
        age_s=40,
        next_attempt_at=timezone.now() + timedelta(seconds=30),
    )
    delivery(endpoint, "msg_done", DeliveryState.DONE, age_s=90)
    delivery(endpoint, "msg_gave_up", DeliveryState.RETRYABLE, age_s=90)
    stale = delivery(
        endpoint,
        "msg_stale",
        DeliveryState.PROCESSING,
        age_s=process.PROCESSING_STALE_AFTER.total_seconds() + 5,
    )

    assert process.claim_lost_deliveries() == [stale.pk, older.pk, overdue.pk, newer.pk]
    # Claimed: a second beat tick (or a racing sweep) sends none of them again.
    assert process.claim_lost_deliveries() == []
    # The claimed retry is due now, so the re-sent task may take it.
    overdue.refresh_from_db()
    assert overdue.next_attempt_at <= timezone.now()


def test_a_duplicate_task_for_one_delivery_makes_one_attempt(endpoint):
    queued = delivery(endpoint, "msg_dup", age_s=60)
    assert process._claim(queued.pk) is True
    assert process._claim(queued.pk) is False  # the sweep's copy, or the late original
    queued.refresh_from_db()
    assert (queued.state, queued.attempts) == (DeliveryState.PROCESSING, 1)


def test_the_sweep_runs_on_the_beat_with_expiry_under_its_interval():
    entry = settings.CELERY_BEAT_SCHEDULE["webhook-delivery-sweep"]
    assert entry["task"] == "intake.sweep_lost_deliveries"
    interval = entry["schedule"].total_seconds()
    assert interval == settings.WEBHOOK_SWEEP_SECONDS
    assert 0 < entry["options"]["expires"] < interval


def test_a_refused_send_is_counted_and_never_raised(settings):
    from controlplane.celery import app
    from controlplane.embedded.redis import free_port
    from tests.fixtures.broker import point_producer_at

    before = jobs.failed_sends()
    with point_producer_at(f"redis://127.0.0.1:{free_port()}/0"), jobs.tracking() as sends:
        assert jobs.send("intake.sweep_lost_deliveries") is False
    assert jobs.failed_sends() == before + 1
    assert sends.failed == ["intake.sweep_lost_deliveries"]
    assert not sends.all_sent
    assert app.conf.broker_url == settings.CELERY_BROKER_URL


def test_a_quarantine_catch_up_refused_by_the_broker_never_fails_its_caller():
    from controlplane.embedded.redis import free_port
    from controlplane.refresh import quarantine
    from tests.fixtures.broker import point_producer_at

    before = jobs.failed_sends()
    with point_producer_at(f"redis://127.0.0.1:{free_port()}/0"):
        quarantine.enqueue_catch_up(12345)  # raised ConnectionError before
    assert jobs.failed_sends() == before + 1
