"""Trainer integration models: webhook endpoints and what they received, and remembered
idempotency keys. Notification destinations and deliveries live in `controlplane.notify`."""

from controlplane.intake.models.idempotency import IdempotencyRecord, IdempotencyState
from controlplane.intake.models.webhooks import (
    PENDING_STATES,
    DeliveryState,
    ReceivedWebhook,
    ReceivedWebhookOutcome,
    WebhookEndpoint,
    WebhookPolicy,
)

__all__ = [
    "PENDING_STATES",
    "DeliveryState",
    "IdempotencyRecord",
    "IdempotencyState",
    "ReceivedWebhook",
    "ReceivedWebhookOutcome",
    "WebhookEndpoint",
    "WebhookPolicy",
]
