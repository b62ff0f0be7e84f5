"""Sending one notification delivery: outbound policy, formatting, signing, the attempt log.

Retries are owned here rather than by Celery's retry machinery because the attempt count that
matters is the one people see in the delivery log; the task only schedules the next try.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

import httpx
from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from controlplane.dynamo.policy import OutboundPolicy
from controlplane.notify.models import (
    DeliveryStatus,
    DestinationKind,
    NotificationAttempt,
    NotificationDelivery,
)
from controlplane.notify.signing import sign_headers

logger = logging.getLogger(__name__)

TIMEOUT_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 3600.0
EXCERPT_CHARS = 500
#: Answers that may succeed later; any other 4xx means the request itself is wrong.
RETRYABLE_STATUS = frozenset({408, 425, 429})
#: At most this many overdue deliveries are re-enqueued per sweep; the rest wait for the next.
SWEEP_BATCH = 500


#: The delivery task, sent by name (`controlplane.jobs`). Its name predates the notify app.
DELIVER_TASK = "intake.deliver_notification"


def backoff_seconds(attempt: int) -> float:
    """Exponential: base, 2*base, 4*base, ... capped at an hour."""
    base = settings.NOTIFICATION_RETRY_BASE_SECONDS
    return min(base * (2 ** (attempt - 1)), MAX_BACKOFF_SECONDS)


def slack_body(payload: dict) -> dict:
    data = payload.get("data", {})
    parts = [f"*{payload.get('title', payload.get('type'))}*"]
    if source := data.get("source"):
        parts.append(f"source `{source['name']}`")
    if gate := data.get("gate"):
        parts.append(f"namespace `{gate['namespace']}`")
    if refresh := data.get("refresh"):
        parts.append(f"refresh #{refresh['id']} ({refresh.get('state')})")
    text = " · ".join(parts)
    if reason := data.get("reason"):
        text += f"\nReason: {reason}"
    if refresh and refresh.get("link"):
        text += f"\n<{refresh['link']}|Open the policy refresh>"
    return {"text": text}


def render(delivery: NotificationDelivery) -> tuple[bytes, dict[str, str]]:
    destination = delivery.destination
    headers = {"content-type": "application/json"}
    if destination.kind == DestinationKind.SLACK:
        return json.dumps(slack_body(delivery.payload)).encode(), headers
    body = json.dumps(delivery.payload, sort_keys=True).encode()
    if destination.secret:
        headers |= sign_headers(destination.secret, delivery.message_id, body)
    return body, headers


def _claim(delivery_id: int, expect_attempts: int | None = None) -> NotificationDelivery | None:
    """Take the next attempt number with a conditional UPDATE, so a duplicated task (acks_late
    redelivery) sends nothing twice at the same time. With `expect_attempts`, claim only if no
    attempt was made since the caller looked (the sweeper's re-enqueued copies)."""
    delivery = (
        NotificationDelivery.objects.select_related("destination").filter(pk=delivery_id).first()
    )
    if delivery is None or delivery.status in (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED):
        return None
    if expect_attempts is not None and delivery.attempts != expect_attempts:
        return None
    claimed = NotificationDelivery.objects.filter(
        pk=delivery_id, attempts=delivery.attempts, status=delivery.status
    ).update(attempts=F("attempts") + 1)
    if not claimed:
        return None
    delivery.attempts += 1
    return delivery


def _finish(delivery, *, ok: bool, retryable: bool, error: str) -> float | None:
    now = timezone.now()
    if ok:
        delivery.status, delivery.delivered_at, delivery.next_attempt_at = (
            DeliveryStatus.DELIVERED,
            now,
            None,
        )
        delivery.last_error = ""
        retry_in = None
    elif retryable and delivery.attempts < settings.NOTIFICATION_MAX_ATTEMPTS:
        retry_in = backoff_seconds(delivery.attempts)
        delivery.status = DeliveryStatus.RETRYING
        delivery.next_attempt_at = now + timedelta(seconds=retry_in)
        delivery.last_error = error
    else:
        delivery.status, delivery.next_attempt_at, delivery.last_error = (
            DeliveryStatus.FAILED,
            None,
            error,
        )
        retry_in = None
    delivery.save(update_fields=["status", "delivered_at", "next_attempt_at", "last_error"])
    return retry_in


def attempt_delivery(
    delivery_id: int,
    *,
    transport: httpx.BaseTransport | None = None,
    expect_attempts: int | None = None,
):
    """Make one attempt. Returns seconds until the next attempt, or None when finished (or when
    someone else made the attempt)."""
    delivery = _claim(delivery_id, expect_attempts)
    if delivery is None:
        return None
    destination = delivery.destination
    attempt = NotificationAttempt(
        delivery=delivery, number=delivery.attempts, attempted_at=timezone.now()
    )
    if not destination.enabled:
        attempt.error = "destination is disabled"
        attempt.save()
        return _finish(delivery, ok=False, retryable=False, error=attempt.error)
    try:
        violation = OutboundPolicy.from_cidrs(destination.allowed_networks).violation(
            destination.url
        )
    except ValueError as exc:
        violation = str(exc)
    if violation:
        attempt.error = f"outbound policy: {violation}"
        attempt.save()
        return _finish(delivery, ok=False, retryable=False, error=attempt.error)

    body, headers = render(delivery)
    started = time.perf_counter()
    retryable = True
    try:
        with httpx.Client(
            follow_redirects=False,
            trust_env=False,
            timeout=TIMEOUT_SECONDS,
            transport=transport,
            headers={"user-agent": "dynamo-rl-controlplane"},
        ) as client:
            response = client.post(destination.url, content=body, headers=headers)
        attempt.status_code = response.status_code
        attempt.response_excerpt = response.text[:EXCERPT_CHARS]
        attempt.ok = 200 <= response.status_code < 300
        if not attempt.ok:
            attempt.error = f"HTTP {response.status_code}"
            retryable = response.status_code >= 500 or response.status_code in RETRYABLE_STATUS
    except httpx.HTTPError as exc:
        attempt.error = f"{type(exc).__name__}: {exc}"[:1000]
    attempt.duration_ms = (time.perf_counter() - started) * 1000
    attempt.save()
    if not attempt.ok:
        logger.info(
            "notification delivery %s attempt %s failed: %s",
            delivery.pk,
            attempt.number,
            attempt.error,
        )
    return _finish(delivery, ok=attempt.ok, retryable=retryable, error=attempt.error)


def claim_stuck_deliveries(grace_seconds: float) -> list[tuple[int, int]]:
    """Unfinished deliveries whose next attempt is more than `grace_seconds` overdue, as
    `(id, attempts)`. A pending delivery never attempted counts from its creation.

    Each is claimed by moving `next_attempt_at` one grace period ahead with a conditional
    UPDATE, so a duplicate beat tick re-enqueues nothing twice, and a re-enqueued task that is
    lost too is found again on a later sweep.
    """
    now = timezone.now()
    cutoff = now - timedelta(seconds=grace_seconds)
    overdue = NotificationDelivery.objects.filter(
        Q(status=DeliveryStatus.RETRYING, next_attempt_at__lt=cutoff)
        | Q(status=DeliveryStatus.PENDING, next_attempt_at__lt=cutoff)
        | Q(status=DeliveryStatus.PENDING, next_attempt_at__isnull=True, created_at__lt=cutoff)
    ).values_list("pk", "attempts", "status", "next_attempt_at")
    claimed = []
    for pk, attempts, status, due in overdue.order_by("pk")[:SWEEP_BATCH]:
        won = NotificationDelivery.objects.filter(
            pk=pk, attempts=attempts, status=status, next_attempt_at=due
        ).update(next_attempt_at=now + timedelta(seconds=grace_seconds))
        if won:
            claimed.append((pk, attempts))
    if claimed:
        logger.warning("re-enqueueing %d overdue notification deliveries", len(claimed))
    return claimed
