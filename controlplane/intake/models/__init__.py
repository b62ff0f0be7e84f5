"""Trainer integration models: webhook endpoints and what they received, notification
destinations and their deliveries, and remembered idempotency keys."""

from controlplane.intake.models.idempotency import IdempotencyRecord, IdempotencyState
from controlplane.intake.models.notifications import (
    DeliveryStatus,
    DestinationKind,
    NotificationAttempt,
    NotificationDelivery,
    NotificationDestination,
    NotificationEvent,
)
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
    "DeliveryStatus",
    "DestinationKind",
    "IdempotencyRecord",
    "IdempotencyState",
    "NotificationAttempt",
    "NotificationDelivery",
    "NotificationDestination",
    "NotificationEvent",
    "ReceivedWebhook",
    "ReceivedWebhookOutcome",
    "WebhookEndpoint",
    "WebhookPolicy",
]
