"""Celery adapters for trainer integration. They take ids, re-fetch and call the service.

Notification delivery has its own tasks in `controlplane.notify.tasks`.
"""

from celery import shared_task

from controlplane import jobs
from controlplane.intake.webhooks.trainer.process import (
    PROCESS_TASK,
    claim_lost_deliveries,
    process_delivery,
)


@shared_task(name=PROCESS_TASK, acks_late=True, ignore_result=True)
def process_webhook(delivery_id: int) -> None:
    """Plan and start what a stored trainer webhook asks for; retry transient failures."""
    retry_in = process_delivery(delivery_id)
    if retry_in is not None:
        # Refused by the broker: the delivery is `retrying`, and the sweep finds it overdue.
        jobs.send(PROCESS_TASK, delivery_id, countdown=retry_in)


@shared_task(name="intake.sweep_lost_deliveries", ignore_result=True)
def sweep_lost_deliveries() -> list[int]:
    """Beat: enqueue again, oldest first, every delivery whose task was lost (the broker was
    down when it was accepted, or restarted empty). Returns the ids sent."""
    claimed = claim_lost_deliveries()
    for delivery_id in claimed:
        if not jobs.send(PROCESS_TASK, delivery_id):
            break  # the broker is away again: the rest are found again a grace later
    return claimed
