"""`GET /api/v1/webhooks/deliveries/<webhook-id>`: what became of a trainer's webhook."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from django.http import HttpRequest
from ninja import Path, Query, Router, Schema
from pydantic import Field

from controlplane.accounts.roles import Perm
from controlplane.intake.api.auth import limit_to_sources, require
from controlplane.intake.api.errors import COMMON_ERRORS, ApiError, ErrorOut
from controlplane.intake.models import ReceivedWebhook
from controlplane.refresh.models import PolicyRefresh

router = Router(tags=["trainer webhooks"])

WebhookId = Annotated[str, Path(min_length=1, max_length=200)]


class DeliveryOut(Schema):
    webhook_id: str
    delivery_id: int
    endpoint: str
    source: str
    event_type: str
    received_at: datetime
    updated_at: datetime
    state: str = Field(description="queued, processing, retrying, retryable or done")
    terminal: bool = Field(description="done: a repeat of this webhook is already_processed")
    outcome: str | None = Field(
        None,
        description="once done: started, awaiting_approval, planned, plan_blocked, superseded, "
        "failed or test",
    )
    refresh_id: int | None = None
    refresh_state: str | None = None
    attempts: int
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    detail: str


class DeliveryFilters(Schema):
    endpoint: str | None = Field(
        None, max_length=64, description="the endpoint's name, when the id is used on several"
    )


def serialize_delivery(delivery: ReceivedWebhook) -> dict:
    refresh_state = None
    if delivery.refresh_id is not None:
        refresh_state = (
            PolicyRefresh.objects.filter(pk=delivery.refresh_id)
            .values_list("state", flat=True)
            .first()
        )
    return {
        "webhook_id": delivery.webhook_id,
        "delivery_id": delivery.pk,
        "endpoint": delivery.endpoint.name,
        "source": delivery.endpoint.source.name,
        "event_type": delivery.event_type,
        "received_at": delivery.received_at,
        "updated_at": delivery.updated_at,
        "state": delivery.state,
        "terminal": delivery.terminal,
        "outcome": delivery.outcome or None,
        "refresh_id": delivery.refresh_id,
        "refresh_state": refresh_state,
        "attempts": delivery.attempts,
        "next_attempt_at": delivery.next_attempt_at,
        "last_error": delivery.last_error or None,
        "detail": delivery.detail,
    }


@router.get(
    "/webhooks/deliveries/{webhook_id}",
    response={200: DeliveryOut, 409: ErrorOut, **COMMON_ERRORS},
)
def get_delivery(request: HttpRequest, webhook_id: WebhookId, filters: Query[DeliveryFilters]):
    """A received webhook's state, outcome, refresh, attempts and last error, by its
    `webhook-id`. A token limited to sources sees only those sources' deliveries."""
    require(request, Perm.VIEW)
    deliveries = limit_to_sources(
        request,
        ReceivedWebhook.objects.select_related("endpoint__source").filter(webhook_id=webhook_id),
        field="endpoint__source",
    )
    if filters.endpoint is not None:
        deliveries = deliveries.filter(endpoint__name=filters.endpoint)
    found = list(deliveries[:10])
    if not found:
        raise ApiError(404, "not_found", "no delivery with this webhook id")
    if len(found) > 1:
        raise ApiError(
            409,
            "ambiguous_webhook_id",
            "several endpoints received this webhook id; add ?endpoint=<name>",
            {"endpoints": sorted(d.endpoint.name for d in found)},
        )
    return serialize_delivery(found[0])
