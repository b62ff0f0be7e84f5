"""Celery adapters for outbound notifications. They take ids, re-fetch and call the service."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from controlplane import jobs
from controlplane.notify import delivery
from controlplane.notify.delivery import DELIVER_TASK


# The name predates the notify app (it was intake's task): messages already queued under it,
# including retries scheduled hours ahead, must still find this task after an upgrade.
@shared_task(name=DELIVER_TASK, bind=True, acks_late=True)
def deliver_notification(self, delivery_id: int, expect_attempts: int | None = None) -> None:
    """Attempt one delivery; on a retryable failure schedule the next try with backoff.

    `expect_attempts` (set by the sweeper) makes the attempt conditional on nobody having made
    one since the delivery was found stuck, so a late original task and its re-enqueued copy
    never make two attempts for one slot.
    """
    retry_in = delivery.attempt_delivery(delivery_id, expect_attempts=expect_attempts)
    if retry_in is not None:
        jobs.send(DELIVER_TASK, delivery_id, countdown=retry_in)


@shared_task(name="notify.sweep_stuck_deliveries", ignore_result=True)
def sweep_stuck_deliveries() -> int:
    """Beat task: re-enqueue deliveries whose next attempt is overdue (a worker died holding
    the retry, or the broker was down when the delivery was queued)."""
    stuck = delivery.claim_stuck_deliveries(settings.NOTIFICATION_SWEEP_GRACE_SECONDS)
    for delivery_id, attempts in stuck:
        # A refused send leaves the row overdue; the next sweep tries again.
        jobs.send(DELIVER_TASK, delivery_id, attempts)
    return len(stuck)
