"""The one function every feature calls to write an audit row.

Call it inside the transaction that makes the change it describes, so the change and its audit
row commit or roll back together. It opens its own atomic block (a savepoint when nested).
"""

from dataclasses import dataclass
from typing import Any

from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from controlplane import lockorder, telemetry
from controlplane.audit.actions import ActorType, AuditAction
from controlplane.audit.chain import sign_entry
from controlplane.audit.keys import hmac_keyring
from controlplane.audit.models import AuditChainHead, AuditEvent
from controlplane.correlation import current_correlation_id
from controlplane.requests import client_address
from controlplane.textlimits import LABEL_CHARS, QUOTED_CHARS


@dataclass(frozen=True)
class Actor:
    """Who did it. A null user with type `system` means the control plane itself."""

    type: ActorType
    label: str
    user: Any = None

    @classmethod
    def system(cls, label: str = "system") -> "Actor":
        return cls(ActorType.SYSTEM, label)

    @classmethod
    def for_user(cls, user) -> "Actor":
        return cls(ActorType.USER, user.get_username(), user)

    @classmethod
    def for_token(cls, token) -> "Actor":
        return cls(
            ActorType.TOKEN, f"token:{token.label} ({token.user.get_username()})", token.user
        )

    @classmethod
    def for_webhook(cls, endpoint_name: str) -> "Actor":
        return cls(ActorType.WEBHOOK, f"webhook:{endpoint_name}")


def actor_from_request(request) -> Actor:
    """API authentication sets `request.audit_actor`; sessions give the signed-in user."""
    explicit = getattr(request, "audit_actor", None)
    if explicit is not None:
        return explicit
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return Actor.for_user(user)
    return Actor(ActorType.USER, "anonymous")


def client_ip(request) -> str | None:
    # Forwarded headers count only from TRUSTED_PROXIES (one rule for audit, throttle, metrics).
    return client_address(request)


def _describe_target(target) -> tuple[str, str, str]:
    if target is None:
        return "", "", ""
    if isinstance(target, models.Model):
        return target._meta.label_lower, str(target.pk), str(target)[:QUOTED_CHARS]
    target_type, target_id, *label = target
    return str(target_type), str(target_id), str(label[0] if label else "")[:QUOTED_CHARS]


def record(
    action: AuditAction,
    *,
    actor: Actor | None = None,
    target=None,
    details: dict[str, Any] | None = None,
    request=None,
    source_ip: str | None = None,
    correlation_id: str | None = None,
) -> AuditEvent:
    """Append one event to the chain.

    `target` is a model instance or a `(type, id[, label])` tuple. `details` must be JSON-safe
    with stable keys; it is stored and hashed as given, plus `trace_id` when written inside an
    OpenTelemetry trace (a policy refresh's executor run: controlplane/telemetry.py).
    """
    if actor is None:
        actor = actor_from_request(request) if request is not None else Actor.system()
    if request is not None:
        source_ip = source_ip or client_ip(request)
        correlation_id = correlation_id or getattr(request, "correlation_id", None)
    correlation_id = correlation_id or current_correlation_id() or ""
    trace_id = telemetry.current_trace_id()
    if trace_id and "trace_id" not in (details or {}):
        # Part of the details, so signed and chained like the rest of the row.
        details = {**(details or {}), "trace_id": trace_id}
    target_type, target_id, target_label = _describe_target(target)

    with transaction.atomic():
        # Bump first: the UPDATE takes the lock that serialises writers (see AuditChainHead).
        # Lock order: this is the last lock of the caller's transaction; lock domain rows
        # before calling record() (controlplane/lockorder.py).
        bumped = AuditChainHead.objects.filter(pk=1).update(last_sequence=F("last_sequence") + 1)
        if not bumped:
            AuditChainHead.objects.get_or_create(pk=1)
            AuditChainHead.objects.filter(pk=1).update(last_sequence=F("last_sequence") + 1)
        head = AuditChainHead.objects.get(pk=1)
        event = AuditEvent(
            sequence=head.last_sequence,
            occurred_at=timezone.now(),
            actor_type=actor.type,
            actor_user=actor.user,
            actor_label=actor.label[:LABEL_CHARS],
            source_ip=source_ip,
            action=action,
            target_type=target_type,
            target_id=target_id,
            target_label=target_label,
            details=details or {},
            correlation_id=correlation_id[:64],
            previous_hash=head.last_hash,
        )
        sign_entry(event, hmac_keyring().signing)  # HMAC under the newest key, id stored
        event.save()
        AuditChainHead.objects.filter(pk=1).update(last_hash=event.entry_hash)
    lockorder.note_chain_head_taken()
    return event
