"""Celery adapters for trainer integration. They take ids, re-fetch and call the service.

Notification delivery has its own tasks in `controlplane.notify.tasks`.
"""

from celery import shared_task

from controlplane.intake.webhooks.trainer.process import process_delivery


@shared_task(name="intake.process_webhook", acks_late=True, ignore_result=True)
def process_webhook(delivery_id: int) -> None:
    """Plan and start what a stored trainer webhook asks for; retry transient failures."""
    retry_in = process_delivery(delivery_id)
    if retry_in is not None:
        process_webhook.apply_async((delivery_id,), countdown=retry_in)
