"""Acting on a stored `checkpoint.ready` delivery, in the background (`intake.process_webhook`).

Intake stores the delivery and its audit row and answers 202; this module plans and starts the
policy refresh. Each attempt ends one of three ways:

- **terminal** (state `done`): `started`, `awaiting_approval`, `planned`, `plan_blocked` (a
  worker lacks a route, the membership changed, ... — re-sending cannot help), `failed`
  (the target does not validate), or `superseded` (a later checkpoint for the same scope
  arrived before this one could start: rolling the fleet through a stale checkpoint would be
  worse than skipping it);
- **transient** (state `retrying`): the scope is busy with another refresh, discovery could not
  give a fresh view, or the database aborted us (deadlock, serialization failure, lost
  connection). Retried with exponential backoff until `attempt_limit`, then state `retryable`:
  nothing ran, and the trainer's repeat with the same webhook id runs it again.

A plan made by an attempt that then fails transiently is aborted at once, so retries do not
leave planned refreshes behind.

The delivery row is the outbox: a task that never reached the broker (it was down when the
delivery was accepted) or that the broker lost (restarted empty) leaves the row `queued`, or
`retrying` past its time, and the sweep (`claim_lost_deliveries`, beat) enqueues it again,
oldest first. A duplicate task is harmless: `_claim` lets one attempt take a delivery.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import OperationalError
from django.db.models import F, Q
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.intake.models import DeliveryState, ReceivedWebhook, WebhookPolicy
from controlplane.intake.models import ReceivedWebhookOutcome as Outcome
from controlplane.intake.webhooks.trainer.events import (
    CHECKPOINT_READY,
    CheckpointReady,
    WebhookResponse,
    approval_reasons,
)
from controlplane.refresh import intents
from controlplane.refresh.errors import PlanBlocked, RefreshConflict, RefreshError
from controlplane.refresh.models import ScopeLock
from controlplane.textlimits import QUOTED_CHARS, REASON_CHARS

logger = logging.getLogger(__name__)

#: A delivery left `processing` this long lost its task (worker killed); it may be taken again.
PROCESSING_STALE_AFTER = timedelta(minutes=10)
PROCESS_TASK = "intake.process_webhook"
#: At most this many deliveries are enqueued again per sweep; the next sweep takes the rest.
SWEEP_BATCH = 500


class Transient(Exception):
    """This attempt could not finish for a reason that should pass; try again later."""


def retry_delay(attempt: int) -> float:
    base = settings.WEBHOOK_RETRY_BASE_SECONDS
    return min(base * (2 ** (attempt - 1)), settings.WEBHOOK_RETRY_MAX_SECONDS)


def _claim(delivery_id: int) -> bool:
    now = timezone.now()
    takeable = Q(state__in=(DeliveryState.QUEUED, DeliveryState.RETRYING)) | Q(
        state=DeliveryState.PROCESSING, updated_at__lt=now - PROCESSING_STALE_AFTER
    )
    return bool(
        ReceivedWebhook.objects.filter(takeable, pk=delivery_id).update(
            state=DeliveryState.PROCESSING, attempts=F("attempts") + 1, updated_at=now
        )
    )


def sweep_grace() -> timedelta:
    return timedelta(seconds=settings.WEBHOOK_SWEEP_SECONDS)


def sweep_within_seconds() -> float:
    """At most how long after the broker is back a lost delivery is enqueued again: its grace
    plus one sweep interval."""
    return 2 * settings.WEBHOOK_SWEEP_SECONDS


def claim_lost_deliveries() -> list[int]:
    """Deliveries whose task looks lost, oldest accepted first: `queued` and untouched for the
    sweep grace, `retrying` with the next attempt overdue by it, `processing` gone stale.

    Each is claimed by moving its `updated_at` (and an overdue `next_attempt_at`) on with a
    conditional UPDATE, so a second beat tick, or a sweep racing the task it replaces, does not
    enqueue it twice; one whose new task is lost too is found again a grace later."""
    now = timezone.now()
    cutoff = now - sweep_grace()
    lost = (
        Q(state=DeliveryState.QUEUED, updated_at__lt=cutoff)
        | Q(state=DeliveryState.RETRYING, next_attempt_at__lt=cutoff)
        | Q(state=DeliveryState.PROCESSING, updated_at__lt=now - PROCESSING_STALE_AFTER)
    )
    found = (
        ReceivedWebhook.objects.filter(lost, event_type=CHECKPOINT_READY)
        .order_by("received_at", "pk")
        .values_list("pk", "state", "updated_at")[:SWEEP_BATCH]
    )
    claimed = []
    for pk, state, updated_at in found:
        moved = {"updated_at": now}
        if state == DeliveryState.RETRYING:
            moved["next_attempt_at"] = now
        if ReceivedWebhook.objects.filter(pk=pk, state=state, updated_at=updated_at).update(
            **moved
        ):
            claimed.append(pk)
    if claimed:
        logger.warning("re-enqueueing %d webhook deliveries whose task was lost", len(claimed))
    return claimed


def process_delivery(delivery_id: int) -> float | None:
    """Run one attempt. Returns the seconds until the next one when it should be retried."""
    if not _claim(delivery_id):
        return None  # done, or another task has it
    delivery = ReceivedWebhook.objects.select_related("endpoint__source").get(pk=delivery_id)
    try:
        outcome, refresh_id, detail = _attempt(delivery)
    except Transient as exc:
        error = str(exc)
    except OperationalError as exc:
        # Deadlock, serialization failure, a dropped connection: the database's word that
        # trying again may work.
        error = f"database: {str(exc).splitlines()[0][:QUOTED_CHARS]}"
        logger.warning("webhook %s: transient database error: %s", delivery.webhook_id, error)
    except Exception as exc:
        logger.exception("webhook %s: policy refresh could not be started", delivery.webhook_id)
        error = f"internal error ({type(exc).__name__})"
    else:
        _finish(delivery, outcome, refresh_id, detail)
        return None
    return _retry_later(delivery, error)


def _finish(delivery: ReceivedWebhook, outcome: str, refresh_id: int | None, detail: str) -> None:
    ReceivedWebhook.objects.filter(pk=delivery.pk).update(
        state=DeliveryState.DONE,
        outcome=outcome,
        detail=detail[:REASON_CHARS],
        refresh_id=refresh_id,
        next_attempt_at=None,
        updated_at=timezone.now(),
        response=WebhookResponse(
            status="processed",
            webhook_id=delivery.webhook_id,
            delivery_id=delivery.pk,
            outcome=outcome,
            refresh_id=refresh_id,
            detail=detail[:REASON_CHARS],
        ),
    )


def _retry_later(delivery: ReceivedWebhook, error: str) -> float | None:
    delivery.refresh_from_db(fields=["attempts", "attempt_limit"])
    now = timezone.now()
    if delivery.attempts >= delivery.attempt_limit:
        ReceivedWebhook.objects.filter(pk=delivery.pk).update(
            state=DeliveryState.RETRYABLE,
            last_error=error[:REASON_CHARS],
            next_attempt_at=None,
            updated_at=now,
        )
        return None
    delay = retry_delay(delivery.attempts)
    ReceivedWebhook.objects.filter(pk=delivery.pk).update(
        state=DeliveryState.RETRYING,
        last_error=error[:REASON_CHARS],
        next_attempt_at=now + timedelta(seconds=delay),
        updated_at=now,
    )
    return delay


def _scope(namespaces) -> tuple[str, ...] | None:
    return tuple(sorted(set(namespaces))) if namespaces else None


def _newer_delivery(delivery: ReceivedWebhook, namespaces) -> str | None:
    """The webhook id of a later checkpoint for the same scope that may still run, if any."""
    later = (
        ReceivedWebhook.objects.filter(
            endpoint_id=delivery.endpoint_id, event_type=CHECKPOINT_READY, pk__gt=delivery.pk
        )
        .exclude(state=DeliveryState.DONE, outcome=Outcome.FAILED)
        .order_by("-pk")
        .values_list("webhook_id", "payload__data__namespaces")
    )
    endpoint_default = delivery.endpoint.namespaces or None
    for webhook_id, their_namespaces in later:
        if _scope(their_namespaces or endpoint_default) == _scope(namespaces):
            return webhook_id
    return None


def _busy(source, namespaces) -> str | None:
    locks = ScopeLock.objects.filter(source=source)
    if namespaces:
        locks = locks.filter(namespace__in=namespaces)
    lock = locks.select_related("refresh").first()
    if lock is None:
        return None
    return f"policy refresh #{lock.refresh_id} ({lock.refresh.state}) is active on {lock.namespace}"


def _abandon(refresh, actor: Actor) -> None:
    """Drop a plan this attempt cannot start, so a retry does not leave it behind."""
    with contextlib.suppress(RefreshError):  # someone else moved it on: it is theirs now
        intents.abort_policy_refresh(refresh, actor=actor)


def _attempt(delivery: ReceivedWebhook) -> tuple[str, int | None, str]:
    endpoint = delivery.endpoint
    event = CheckpointReady.model_validate(delivery.payload.get("data", {}))
    namespaces = event.namespaces or endpoint.namespaces or None
    newer = _newer_delivery(delivery, namespaces)
    if newer is not None:
        return Outcome.SUPERSEDED, None, f"superseded by webhook {newer} for the same scope"
    busy = _busy(endpoint.source, namespaces)
    if busy:
        raise Transient(f"scope busy: {busy}")

    reasons = approval_reasons(endpoint.rules or [], event.metrics)
    require_approval = endpoint.policy == WebhookPolicy.REQUIRE_APPROVAL or bool(reasons)
    actor = Actor.for_webhook(endpoint.name)
    if event.strategy is not None and not endpoint.allow_strategy_override:
        # Overrides were switched off after this delivery was accepted: the endpoint's word now.
        return Outcome.FAILED, None, "this endpoint no longer lets a webhook choose its strategy"
    try:
        refresh = intents.plan_policy_refresh(
            source=endpoint.source,
            actor=actor,
            target=event.target(),
            namespaces=namespaces,
            pause_mode=endpoint.pause_mode,
            inflight_may_straddle=endpoint.inflight_may_straddle,
            fingerprint=event.fingerprint_dict(),
            # The event's own (when allowed), else the endpoint's, else (None) the source's.
            strategy=event.strategy
            if event.strategy is not None
            else (endpoint.default_strategy or None),
        )
    except ValidationError as exc:
        return Outcome.FAILED, None, "; ".join(exc.messages)
    if refresh.plan_blockers:
        blockers = "; ".join(str(b) for b in refresh.plan_blockers)
        if refresh.discovery_run is None or not refresh.discovery_run.ok:
            _abandon(refresh, actor)
            raise Transient(f"no fresh discovery for the plan: {blockers}")
        return Outcome.PLAN_BLOCKED, refresh.pk, f"plan_blocked: {blockers}"
    try:
        refresh = intents.start_policy_refresh(
            refresh, actor=actor, require_approval=require_approval
        )
    except RefreshConflict as exc:
        _abandon(refresh, actor)
        raise Transient(f"scope busy: {exc.message}") from None
    except OperationalError:
        _abandon(refresh, actor)
        raise
    except PlanBlocked as exc:
        return Outcome.PLAN_BLOCKED, refresh.pk, f"plan_blocked: {exc.message}"
    except RefreshError as exc:
        return Outcome.FAILED, refresh.pk, f"{exc.code}: {exc.message}"
    refresh.refresh_from_db(fields=["state"])
    outcome = {
        "awaiting_approval": Outcome.AWAITING_APPROVAL,
        "planned": Outcome.PLANNED,
    }.get(refresh.state, Outcome.STARTED)
    return outcome, refresh.pk, "; ".join(reasons)
