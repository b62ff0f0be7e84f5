"""The sweeper re-enqueues deliveries whose queued task was lost, once, through a real worker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from controlplane.celery import app
from controlplane.notify.delivery import attempt_delivery, claim_stuck_deliveries
from controlplane.notify.models import DeliveryStatus, NotificationDelivery, NotificationDestination
from controlplane.notify.tasks import deliver_notification, sweep_stuck_deliveries
from tests.integration.fleet.conftest import wait_for
from tests.integration.notify.conftest import SECRET

GRACE = 60.0


@pytest.fixture
def destination(db, receiver):
    return NotificationDestination.objects.create(
        name="ops",
        kind="webhook",
        url=receiver["url"],
        secret=SECRET,
        allowed_networks=["127.0.0.0/8"],
    )


def _delivery(destination, *, status, attempts=0, due=None, age=timedelta(0)):
    delivery = NotificationDelivery.objects.create(
        destination=destination, event="test", payload={"type": "test"}
    )
    # created_at is auto_now_add: age it with an UPDATE, as time would.
    NotificationDelivery.objects.filter(pk=delivery.pk).update(
        status=status,
        attempts=attempts,
        next_attempt_at=due,
        created_at=timezone.now() - age,
    )
    return delivery.pk


def _overdue_and_fine(destination):
    now = timezone.now()
    return {
        # a worker died holding the retry of attempt 1
        "lost_retry": _delivery(
            destination, status=DeliveryStatus.RETRYING, attempts=1, due=now - timedelta(hours=1)
        ),
        # the broker was down when it was queued: pending for ten minutes, never attempted
        "never_queued": _delivery(
            destination, status=DeliveryStatus.PENDING, age=timedelta(minutes=10)
        ),
        # not yet due, or due only moments ago: its own task will come
        "waiting": _delivery(
            destination, status=DeliveryStatus.RETRYING, attempts=1, due=now + timedelta(hours=1)
        ),
        "just_due": _delivery(
            destination, status=DeliveryStatus.RETRYING, attempts=1, due=now - timedelta(seconds=5)
        ),
        "fresh": _delivery(destination, status=DeliveryStatus.PENDING),
        "delivered": _delivery(
            destination, status=DeliveryStatus.DELIVERED, attempts=1, age=timedelta(hours=2)
        ),
        "failed": _delivery(
            destination, status=DeliveryStatus.FAILED, attempts=6, age=timedelta(hours=2)
        ),
    }


def test_sweep_claims_only_overdue_deliveries_once(destination):
    ids = _overdue_and_fine(destination)

    claimed = claim_stuck_deliveries(GRACE)

    assert sorted(claimed) == sorted([(ids["lost_retry"], 1), (ids["never_queued"], 0)])
    assert claim_stuck_deliveries(GRACE) == []  # a duplicate beat tick re-enqueues nothing
    for name in ("lost_retry", "never_queued"):
        due = NotificationDelivery.objects.get(pk=ids[name]).next_attempt_at
        assert due > timezone.now()  # found again only if this re-enqueued copy is lost too


def test_a_swept_copy_does_nothing_once_the_original_attempt_ran(destination, receiver):
    pk = _delivery(
        destination,
        status=DeliveryStatus.RETRYING,
        attempts=1,
        due=timezone.now() - timedelta(hours=1),
    )
    ((_, seen),) = claim_stuck_deliveries(GRACE)
    receiver["script"] = [503]
    assert attempt_delivery(pk) is not None  # the original task turned up late after all

    assert attempt_delivery(pk, expect_attempts=seen) is None  # the sweeper's copy
    delivery = NotificationDelivery.objects.get(pk=pk)
    assert delivery.attempts == 2 and delivery.status == DeliveryStatus.RETRYING
    assert len(receiver["received"]) == 1


@pytest.mark.celery
def test_worker_delivers_what_the_beat_sweep_re_enqueues(celery_worker, destination, receiver):
    ids = _overdue_and_fine(destination)
    untouched = {
        pk: NotificationDelivery.objects.filter(pk=pk).values().get()
        for name, pk in ids.items()
        if name not in ("lost_retry", "never_queued")
    }

    assert sweep_stuck_deliveries() == 2  # as beat calls it

    def delivered():
        rows = NotificationDelivery.objects.filter(pk__in=[ids["lost_retry"], ids["never_queued"]])
        return all(d.status == DeliveryStatus.DELIVERED for d in rows)

    wait_for(delivered)
    assert NotificationDelivery.objects.get(pk=ids["lost_retry"]).attempts == 2
    assert NotificationDelivery.objects.get(pk=ids["never_queued"]).attempts == 1
    assert sweep_stuck_deliveries() == 0
    # A delivery queued behind the sweep proves the worker went through the queue; nothing
    # else was sent and no other row changed.
    behind = _delivery(destination, status=DeliveryStatus.PENDING)
    deliver_notification.delay(behind)
    wait_for(lambda: NotificationDelivery.objects.get(pk=behind).status == "delivered")
    assert len(receiver["received"]) == 3
    for pk, before in untouched.items():
        assert NotificationDelivery.objects.filter(pk=pk).values().get() == before


@pytest.mark.celery
def test_messages_queued_under_the_old_intake_task_name_are_still_delivered(
    celery_worker, destination, receiver
):
    pk = _delivery(destination, status=DeliveryStatus.PENDING)
    app.send_task("intake.deliver_notification", args=[pk])
    wait_for(lambda: NotificationDelivery.objects.get(pk=pk).status == "delivered")
    assert len(receiver["received"]) == 1


def test_beat_schedules_the_sweep():
    entry = settings.CELERY_BEAT_SCHEDULE["notification-sweep"]
    assert entry["task"] == sweep_stuck_deliveries.name
    assert entry["schedule"].total_seconds() == settings.NOTIFICATION_SWEEP_GRACE_SECONDS
