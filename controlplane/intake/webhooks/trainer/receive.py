"""Receiving one trainer webhook: size, endpoint, signature, JSON, event, replay, then storage.

`receive` never raises for anything a sender can do: every refusal is a 4xx with a stable code
and an audit row. A valid `checkpoint.ready` is stored with its audit row in one transaction and
answered 202 at once; a Celery task (`process.py`) plans and starts the refresh, and the trainer
reads the outcome from `GET /api/v1/webhooks/deliveries/<webhook-id>` (or by sending the same
delivery again). Only a delivery with a terminal outcome is `already_processed`.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pydantic
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import jobs
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.dynamo.jsonsafe import UnsafeJSON, loads_bounded
from controlplane.intake.models import (
    DeliveryState,
    ReceivedWebhook,
    ReceivedWebhookOutcome,
    WebhookEndpoint,
)
from controlplane.intake.models import WebhookPolicy as Policy
from controlplane.intake.strategy import StrategyRefused, checked
from controlplane.intake.webhooks.trainer.applied import refresh_applied
from controlplane.intake.webhooks.trainer.broadcast import broadcast_done
from controlplane.intake.webhooks.trainer.events import (
    BROADCAST_DONE,
    CANARY_VERDICT,
    CHECKPOINT_READY,
    EVENT_TYPES,
    POLICY_PUBLISHED,
    REFRESH_APPLIED,
    TEST_PING,
    CheckpointReady,
    approval_reasons,
)
from controlplane.intake.webhooks.trainer.process import PROCESS_TASK, sweep_within_seconds
from controlplane.intake.webhooks.trainer.published import policy_published, record_checkpoint
from controlplane.intake.webhooks.trainer.verdict import canary_verdict
from controlplane.notify.signing import VerificationError, sign_headers, verify
from controlplane.textlimits import QUOTED_CHARS, SUMMARY_CHARS

#: A trainer's repeat re-enqueues a delivery whose task looks lost after these.
STALE = timedelta(minutes=10)
STALE_RETRY = timedelta(seconds=60)
_ENDPOINT_NAME = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
Outcome = ReceivedWebhookOutcome


#: Events about one refresh that are acted on at once (not queued): their handler and outcome.
_ACTED_AT_ONCE = {
    REFRESH_APPLIED: (refresh_applied, Outcome.APPLIED),
    CANARY_VERDICT: (canary_verdict, Outcome.CANARY_VERDICT),
}


@dataclass
class Answer:
    status: int
    body: dict[str, Any]


def _error(status: int, code: str, message: str, details: Any = None) -> Answer:
    return Answer(status, {"error": {"code": code, "message": message, "details": details}})


def _reject(endpoint_name: str, answer: Answer, *, webhook_id: str | None, source_ip) -> Answer:
    error = answer.body["error"]
    record(
        AuditAction.WEBHOOK_REJECTED,
        actor=Actor.for_webhook(endpoint_name[:64]),
        target=("intake.webhookendpoint", endpoint_name[:64], endpoint_name[:64]),
        details={
            "status": answer.status,
            "code": error["code"],
            "message": error["message"][:QUOTED_CHARS],
            "webhook_id": (webhook_id or "")[:SUMMARY_CHARS],
        },
        source_ip=source_ip,
    )
    return answer


def too_large(endpoint_name: str, *, source_ip=None) -> Answer:
    limit = settings.WEBHOOK_MAX_BODY_BYTES
    answer = _error(413, "payload_too_large", f"body exceeds {limit} bytes")
    return _reject(endpoint_name, answer, webhook_id=None, source_ip=source_ip)


def receive(
    endpoint_name: str, headers: dict[str, str], body: bytes, *, source_ip: str | None = None
) -> Answer:
    """Verify and act on one delivery. `headers` must have lower-case names."""
    webhook_id = headers.get("webhook-id")

    def reject(answer: Answer) -> Answer:
        return _reject(endpoint_name, answer, webhook_id=webhook_id, source_ip=source_ip)

    if len(body) > settings.WEBHOOK_MAX_BODY_BYTES:
        return too_large(endpoint_name, source_ip=source_ip)
    endpoint = None
    if _ENDPOINT_NAME.match(endpoint_name):
        endpoint = (
            WebhookEndpoint.objects.select_related("source")
            .filter(name=endpoint_name, enabled=True)
            .first()
        )
    if endpoint is None:
        return reject(_error(404, "unknown_endpoint", "no enabled webhook endpoint by this name"))
    try:
        verify(
            endpoint.secrets, headers, body, tolerance_seconds=settings.WEBHOOK_TOLERANCE_SECONDS
        )
    except VerificationError as exc:
        status = 400 if exc.code.startswith(("missing", "malformed")) else 401
        return reject(_error(status, exc.code, exc.message))

    # Signed from here on: the sender holds the secret, so content problems are its bugs.
    assert webhook_id is not None  # verify() refuses a delivery without one
    try:
        envelope = loads_bounded(
            body, max_depth=settings.JSON_MAX_DEPTH, max_bytes=settings.WEBHOOK_MAX_BODY_BYTES
        )
    except UnsafeJSON as exc:
        return reject(_error(400, exc.code, f"body is not acceptable JSON: {exc.message}"))
    if not isinstance(envelope, dict) or not isinstance(envelope.get("data", {}), dict):
        return reject(_error(400, "invalid_event", "body must be an object with a data object"))
    event_type = envelope.get("type")
    if event_type not in EVENT_TYPES:
        return reject(
            _error(
                400,
                "unknown_event_type",
                f"event type {str(event_type)[:64]!r} is not one of {', '.join(EVENT_TYPES)}",
            )
        )
    digest = hashlib.sha256(body).hexdigest()
    if event_type == BROADCAST_DONE:
        (status, answer_body), done = broadcast_done(endpoint, webhook_id, envelope.get("data", {}))
        answer = Answer(status, answer_body)
        if done is None:
            return reject(answer)
        return _acted(
            endpoint, webhook_id, envelope, digest, source_ip, Outcome.BROADCAST_DONE, answer, done
        )
    if event_type == POLICY_PUBLISHED:
        (status, answer_body), recorded = policy_published(
            endpoint, webhook_id, envelope.get("data", {})
        )
        answer = Answer(status, answer_body)
        if recorded is None:
            return reject(answer)
        return _acted(
            endpoint,
            webhook_id,
            envelope,
            digest,
            source_ip,
            Outcome.POLICY_PUBLISHED,
            answer,
            recorded,
        )
    acts = _ACTED_AT_ONCE.get(event_type)
    if acts is not None:
        handler, outcome = acts
        # A repeat is answered from the stored delivery before anything acts, so a replayed
        # verdict or report never meets a refresh that has already moved on.
        if ReceivedWebhook.objects.filter(endpoint=endpoint, webhook_id=webhook_id).exists():
            return _repeat(endpoint, webhook_id, digest, source_ip)
        (status, answer_body), recorded, refresh_id = handler(
            endpoint, webhook_id, envelope.get("data", {})
        )
        answer = Answer(status, answer_body)
        if recorded is None:
            return reject(answer)
        return _acted(
            endpoint,
            webhook_id,
            envelope,
            digest,
            source_ip,
            outcome,
            answer,
            recorded,
            refresh_id=refresh_id,
        )
    event = None
    if event_type == CHECKPOINT_READY:
        try:
            event = CheckpointReady.model_validate(envelope.get("data", {}))
        except pydantic.ValidationError as exc:
            details = json.loads(exc.json(include_url=False, include_input=False))
            return reject(_error(422, "invalid_event", "checkpoint.ready data is invalid", details))
        allowed = endpoint.namespaces
        if event.namespaces and allowed and not set(event.namespaces) <= set(allowed):
            outside = sorted(set(event.namespaces) - set(allowed))
            return reject(_error(403, "namespace_not_allowed", f"outside this endpoint: {outside}"))
        if event.strategy is not None:
            if not endpoint.allow_strategy_override:
                return reject(
                    _error(
                        403,
                        "strategy_override_not_allowed",
                        "this endpoint does not let a webhook choose its strategy; its "
                        "default strategy applies when the event names none",
                    )
                )
            try:
                checked(event.strategy, "data.strategy")
            except StrategyRefused as exc:
                return reject(_error(422, "invalid_event", str(exc), exc.errors))

    if event is None:  # test.ping: nothing to plan, so it is answered (and done) at once
        answer = Answer(200, {"status": "ok", "webhook_id": webhook_id, "outcome": Outcome.TEST})
        stored = _store(
            endpoint,
            webhook_id,
            event_type,
            envelope,
            digest,
            done=(Outcome.TEST, answer.body, "test event received"),
            audit={"webhook_id": webhook_id, "type": TEST_PING},
            source_ip=source_ip,
        )
        return answer if stored else _repeat(endpoint, webhook_id, digest, source_ip)

    # A checkpoint with a step is a published policy too (policy lag), refresh or not.
    published = record_checkpoint(endpoint, webhook_id, event)
    reasons = approval_reasons(endpoint.rules or [], event.metrics)
    require_approval = endpoint.policy == Policy.REQUIRE_APPROVAL or bool(reasons)
    with jobs.tracking() as sends:
        received = _store(
            endpoint,
            webhook_id,
            event_type,
            envelope,
            digest,
            audit={
                "webhook_id": webhook_id,
                "type": CHECKPOINT_READY,
                "weight_version": event.weight_version,
                "step": event.step,
                "checkpoint_digest": event.checkpoint_digest,
                "metrics": event.metrics,
                "require_approval": require_approval,
                "approval_reasons": reasons,
                "strategy": event.strategy,
                "policy_published": published,
            },
            source_ip=source_ip,
        )
    if received is None:
        return _repeat(endpoint, webhook_id, digest, source_ip)
    return Answer(202, {"status": "accepted", **_progress(received), **_queueing(sends)})


def _acted(
    endpoint,
    webhook_id,
    envelope,
    digest,
    source_ip,
    outcome: str,
    answer: Answer,
    detail,
    *,
    refresh_id: int | None = None,
) -> Answer:
    """An event acted on at once (`broadcast.done`, `canary.verdict`): stored as done with its
    answer, audited with what it did; a repeat of the same webhook id is answered as stored."""
    event_type = envelope.get("type")
    stored = _store(
        endpoint,
        webhook_id,
        event_type,
        envelope,
        digest,
        done=(outcome, answer.body, detail),
        audit={"webhook_id": webhook_id, "type": event_type, "detail": detail},
        source_ip=source_ip,
        refresh_id=refresh_id,
    )
    return answer if stored else _repeat(endpoint, webhook_id, digest, source_ip)


def _store(
    endpoint,
    webhook_id,
    event_type,
    envelope,
    digest,
    *,
    audit,
    source_ip,
    done=None,
    refresh_id: int | None = None,
) -> ReceivedWebhook | None:
    """The delivery and its `webhook.accepted` row in one transaction, the task on commit.
    None when this webhook id was stored before (a repeat)."""
    fields = {"state": DeliveryState.QUEUED, "attempt_limit": settings.WEBHOOK_MAX_ATTEMPTS}
    if done is not None:
        outcome, response, detail = done
        fields = {"state": DeliveryState.DONE, "outcome": outcome, "response": response}
        fields["detail"] = detail
    with transaction.atomic():
        try:
            # Lock order: the delivery row (its unique id) first, the audit chain head last.
            with transaction.atomic():
                received = ReceivedWebhook.objects.create(
                    endpoint=endpoint,
                    webhook_id=webhook_id,
                    event_type=event_type,
                    payload=envelope,
                    body_sha256=digest,
                    refresh_id=refresh_id,
                    **fields,
                )
        except IntegrityError:
            return None
        record(
            AuditAction.WEBHOOK_ACCEPTED,
            actor=Actor.for_webhook(endpoint.name),
            target=endpoint,
            details=audit,
            source_ip=source_ip,
        )
        if done is None:
            _enqueue_on_commit(received.pk)
    return received


def _enqueue_on_commit(delivery_id: int) -> None:
    # A send the broker refuses leaves the delivery `queued`: the sweep enqueues it again.
    jobs.enqueue(PROCESS_TASK, delivery_id)


def _queueing(sends: jobs.Sends) -> dict[str, Any]:
    """Whether the delivery's task reached the broker; if not, what runs it and when. The
    delivery is stored either way: a trainer need not send it again."""
    if sends.all_sent:
        return {"queued": True, "recovery": None}
    within = sweep_within_seconds()
    return {
        "queued": False,
        "recovery": f"the task queue was unavailable; the delivery sweep enqueues it within "
        f"{within:.0f} s of the queue's return",
    }


def _progress(received: ReceivedWebhook) -> dict[str, Any]:
    """What the trainer learns about a delivery in a webhook answer."""
    return {
        "webhook_id": received.webhook_id,
        "delivery_id": received.pk,
        "state": received.state,
        # Until a delivery is done its outcome is `accepted`: stored, and not yet acted on.
        "outcome": received.outcome if received.terminal else "accepted",
        "refresh_id": received.refresh_id,
        "attempts": received.attempts,
        "last_error": received.last_error or None,
        "detail": received.detail,
    }


def _repeat(endpoint, webhook_id: str, digest: str, source_ip) -> Answer:
    """The same webhook id again: the stored answer when done, the current state while pending,
    and a fresh run when our retries had given up (state `retryable`)."""
    rerun = False
    with jobs.tracking() as sends, transaction.atomic():
        original = ReceivedWebhook.objects.select_for_update(no_key=True).get(
            endpoint=endpoint, webhook_id=webhook_id
        )
        if original.body_sha256 and original.body_sha256 != digest:
            conflict = True
        else:
            conflict = False
            now = timezone.now()
            lost = (
                original.state == DeliveryState.QUEUED
                or (
                    original.state == DeliveryState.PROCESSING and original.updated_at < now - STALE
                )
                or (
                    original.state == DeliveryState.RETRYING
                    and original.next_attempt_at is not None
                    and original.next_attempt_at < now - STALE_RETRY
                )
            )
            if original.state == DeliveryState.RETRYABLE:
                rerun = True
                original.state = DeliveryState.QUEUED
                original.attempt_limit = original.attempts + settings.WEBHOOK_MAX_ATTEMPTS
                original.next_attempt_at = None
                original.save(update_fields=["state", "attempt_limit", "next_attempt_at"])
            if rerun or lost:
                # A re-run, or a task the broker may have lost: the claim makes a duplicate
                # harmless.
                _enqueue_on_commit(original.pk)
            record(
                AuditAction.WEBHOOK_REPLAYED,
                actor=Actor.for_webhook(endpoint.name),
                target=endpoint,
                details={
                    "webhook_id": webhook_id,
                    "state": original.state,
                    "outcome": original.outcome,
                    "rerun": rerun,
                },
                source_ip=source_ip,
            )
    if conflict:
        return _reject(
            endpoint.name,
            _error(
                409,
                "webhook_id_reused",
                "this webhook id was delivered before with a different body",
            ),
            webhook_id=webhook_id,
            source_ip=source_ip,
        )
    if original.terminal:
        return Answer(200, {"status": "already_processed", **_progress(original)})
    status = "accepted" if rerun else "pending"
    return Answer(202, {"status": status, **_progress(original), **_queueing(sends)})


def send_test_event(endpoint: WebhookEndpoint) -> Answer:
    """What the "send test event" button does: a signed `test.ping` through the real checks."""
    if not endpoint.secrets:
        return _error(400, "no_secret", "the endpoint has no secret")
    body = json.dumps(
        {"type": TEST_PING, "data": {"message": "test event from the control plane"}}
    ).encode()
    headers = sign_headers(endpoint.secrets[0], f"msg_test_{uuid.uuid4().hex}", body)
    return receive(endpoint.name, headers, body)
