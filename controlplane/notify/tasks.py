"""Celery adapters for outbound notifications. They take ids, re-fetch and call the service."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from controlplane.notify import delivery

logger = logging.getLogger(__name__)


# The name predates the notify app (it was intake's task): messages already queued under it,
# including retries scheduled hours ahead, must still find this task after an upgrade.
@shared_task(name="intake.deliver_notification", bind=True, acks_late=True)
def deliver_notification(self, delivery_id: int, expect_attempts: int | None = None) -> None:
    """Attempt one delivery; on a retryable failure schedule the next try with backoff.

    `expect_attempts` (set by the sweeper) makes the attempt conditional on nobody having made
    one since the delivery was found stuck, so a late original task and its re-enqueued copy
    never make two attempts for one slot.
    """
    retry_in = delivery.attempt_delivery(delivery_id, expect_attempts=expect_attempts)
    if retry_in is not None:
        deliver_notification.apply_async((delivery_id,), countdown=retry_in)


@shared_task(name="notify.sweep_stuck_deliveries", ignore_result=True)
def sweep_stuck_deliveries() -> int:
    """Beat task: re-enqueue deliveries whose next attempt is overdue (a worker died holding
    the retry, or the broker was down when the delivery was queued)."""
    stuck = delivery.claim_stuck_deliveries(settings.NOTIFICATION_SWEEP_GRACE_SECONDS)
    for delivery_id, attempts in stuck:
        try:
            deliver_notification.delay(delivery_id, attempts)
        except Exception:
            # The row stays overdue; the next sweep tries again.
            logger.exception("could not re-enqueue notification delivery %s", delivery_id)
    return len(stuck)
