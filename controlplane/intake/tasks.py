"""Celery adapters for trainer integration. They take ids, re-fetch and call the service."""

from celery import shared_task

from controlplane.intake import delivery


@shared_task(name="intake.deliver_notification", bind=True, acks_late=True)
def deliver_notification(self, delivery_id: int) -> None:
    """Attempt one delivery; on a retryable failure schedule the next try with backoff."""
    retry_in = delivery.attempt_delivery(delivery_id)
    if retry_in is not None:
        deliver_notification.apply_async((delivery_id,), countdown=retry_in)


@shared_task(name="intake.process_webhook", acks_late=True, ignore_result=True)
def process_webhook(delivery_id: int) -> None:
    """Plan and start what a stored trainer webhook asks for; retry transient failures."""
    from controlplane.intake.webhooks.trainer.process import process_delivery

    retry_in = process_delivery(delivery_id)
    if retry_in is not None:
        process_webhook.apply_async((delivery_id,), countdown=retry_in)
