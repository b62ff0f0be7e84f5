"""Celery adapters for trainer integration. They take ids, re-fetch and call the service."""

from celery import shared_task

from controlplane.intake import delivery


@shared_task(name="intake.deliver_notification", bind=True, acks_late=True)
def deliver_notification(self, delivery_id: int) -> None:
    """Attempt one delivery; on a retryable failure schedule the next try with backoff."""
    retry_in = delivery.attempt_delivery(delivery_id)
    if retry_in is not None:
        deliver_notification.apply_async((delivery_id,), countdown=retry_in)
