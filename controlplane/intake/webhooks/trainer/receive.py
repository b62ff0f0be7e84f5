"""Receiving one trainer webhook: size, endpoint, signature, event, replay, then the refresh.

`receive` never raises for anything a sender can do: every refusal is a 4xx with a stable code
and an audit row, and business outcomes (plan blocked, another refresh active) are reported in
a 202 body, since the webhook itself was valid and retrying it cannot change the answer.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

import pydantic
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.intake.models import ReceivedWebhook, ReceivedWebhookOutcome, WebhookEndpoint
from controlplane.intake.models import WebhookPolicy as Policy
from controlplane.intake.signing import VerificationError, sign_headers, verify
from controlplane.intake.webhooks.trainer.events import (
    CHECKPOINT_READY,
    EVENT_TYPES,
    TEST_PING,
    CheckpointReady,
    approval_reasons,
)

logger = logging.getLogger(__name__)
_ENDPOINT_NAME = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
Outcome = ReceivedWebhookOutcome


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
            "message": error["message"][:300],
            "webhook_id": (webhook_id or "")[:200],
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
    try:
        envelope = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return reject(_error(400, "invalid_json", "body is not JSON"))
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

    try:
        with transaction.atomic():
            received = ReceivedWebhook.objects.create(
                endpoint=endpoint, webhook_id=webhook_id, event_type=event_type, payload=envelope
            )
    except IntegrityError:
        return _replayed(endpoint, webhook_id, source_ip)

    actor = Actor.for_webhook(endpoint.name)
    if event is None:  # test.ping
        answer = Answer(200, {"status": "ok", "webhook_id": webhook_id, "outcome": Outcome.TEST})
        _finish(received, Outcome.TEST, answer, detail="test event received")
        record(
            AuditAction.WEBHOOK_ACCEPTED,
            actor=actor,
            target=endpoint,
            details={"webhook_id": webhook_id, "type": TEST_PING},
            source_ip=source_ip,
        )
        return answer
    return _checkpoint_ready(endpoint, received, event, actor, source_ip)


def _replayed(endpoint, webhook_id: str, source_ip) -> Answer:
    original = ReceivedWebhook.objects.get(endpoint=endpoint, webhook_id=webhook_id)
    record(
        AuditAction.WEBHOOK_REPLAYED,
        actor=Actor.for_webhook(endpoint.name),
        target=endpoint,
        details={"webhook_id": webhook_id, "outcome": original.outcome},
        source_ip=source_ip,
    )
    return Answer(
        200,
        {
            "status": "already_processed",
            "webhook_id": webhook_id,
            "outcome": original.outcome,
            "refresh_id": original.refresh_id,
            "detail": original.detail,
        },
    )


def _finish(received, outcome: str, answer: Answer, *, detail: str = "", refresh=None) -> None:
    ReceivedWebhook.objects.filter(pk=received.pk).update(
        outcome=outcome,
        detail=detail[:2000],
        response=answer.body,
        refresh_id=refresh.pk if refresh is not None else None,
    )


def _checkpoint_ready(endpoint, received, event: CheckpointReady, actor, source_ip) -> Answer:
    from controlplane.refresh import actions
    from controlplane.refresh.errors import RefreshError

    reasons = approval_reasons(endpoint.rules or [], event.metrics)
    require_approval = endpoint.policy == Policy.REQUIRE_APPROVAL or bool(reasons)
    record(
        AuditAction.WEBHOOK_ACCEPTED,
        actor=actor,
        target=endpoint,
        details={
            "webhook_id": received.webhook_id,
            "type": CHECKPOINT_READY,
            "weight_version": event.weight_version,
            "step": event.step,
            "checkpoint_digest": event.checkpoint_digest,
            "metrics": event.metrics,
            "require_approval": require_approval,
            "approval_reasons": reasons,
        },
        source_ip=source_ip,
    )
    base = {"status": "accepted", "webhook_id": received.webhook_id}
    refresh = None
    try:
        refresh = actions.plan_policy_refresh(
            source=endpoint.source,
            actor=actor,
            target=event.target(),
            namespaces=event.namespaces or endpoint.namespaces or None,
            pause_mode=endpoint.pause_mode,
            fingerprint=event.fingerprint_dict(),
        )
        refresh = actions.start_policy_refresh(
            refresh, actor=actor, require_approval=require_approval
        )
    except RefreshError as exc:
        outcome = Outcome.CONFLICT if exc.code == "refresh_conflict" else Outcome.PLAN_BLOCKED
        answer = Answer(
            202,
            {
                **base,
                "outcome": outcome,
                "refresh_id": refresh.pk if refresh else getattr(exc, "active_refresh_id", None),
                "detail": f"{exc.code}: {exc.message}",
            },
        )
        _finish(received, outcome, answer, detail=answer.body["detail"], refresh=refresh)
        return answer
    except ValidationError as exc:
        answer = Answer(202, {**base, "outcome": Outcome.FAILED, "detail": "; ".join(exc.messages)})
        _finish(received, Outcome.FAILED, answer, detail=answer.body["detail"], refresh=refresh)
        return answer
    except Exception:
        logger.exception("webhook %s: policy refresh could not be started", received.webhook_id)
        answer = Answer(202, {**base, "outcome": Outcome.FAILED, "detail": "internal error"})
        _finish(received, Outcome.FAILED, answer, detail="internal error", refresh=refresh)
        return answer
    refresh.refresh_from_db()
    outcome = {
        "awaiting_approval": Outcome.AWAITING_APPROVAL,
        "planned": Outcome.PLANNED,
    }.get(refresh.state, Outcome.STARTED)
    detail = "; ".join(reasons) if reasons else ""
    answer = Answer(
        202,
        {
            **base,
            "outcome": outcome,
            "refresh_id": refresh.pk,
            "refresh_state": refresh.state,
            "detail": detail,
        },
    )
    _finish(received, outcome, answer, detail=detail, refresh=refresh)
    return answer


def send_test_event(endpoint: WebhookEndpoint) -> Answer:
    """What the "send test event" button does: a signed `test.ping` through the real checks."""
    if not endpoint.secrets:
        return _error(400, "no_secret", "the endpoint has no secret")
    body = json.dumps(
        {"type": TEST_PING, "data": {"message": "test event from the control plane"}}
    ).encode()
    headers = sign_headers(endpoint.secrets[0], f"msg_test_{uuid.uuid4().hex}", body)
    return receive(endpoint.name, headers, body)
