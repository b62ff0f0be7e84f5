"""Notification destination actions: create, update, remove, new signing secret, test send.

A destination's URL must pass its own allowlist. As for sources, only IP literals are judged
when saving (resolving names here would block the request on DNS); every delivery resolves
and checks the URL again before it connects, and a refusal lands in the attempt log.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import transaction

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.dynamo.urls import url_problem
from controlplane.notify.emit import build_payload, enqueue_delivery
from controlplane.notify.models import (
    DestinationKind,
    NotificationDelivery,
    NotificationDestination,
    NotificationEvent,
)
from controlplane.notify.signing import generate_secret

_SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
FIELDS = ("name", "kind", "url", "allowed_networks", "events", "source", "enabled")
#: Events a destination may subscribe to; `test` is always delivered and not a subscription.
SUBSCRIBABLE = tuple(e.value for e in NotificationEvent if e != NotificationEvent.TEST)
MAX_URL = 500
#: Audit rows name destinations by the model label they had before the notify app existed, so
#: the history's target filter finds a destination's old and new rows alike.
AUDIT_TARGET_TYPE = "intake.notificationdestination"


def _audit_target(destination: NotificationDestination) -> tuple[str, int, str]:
    return (AUDIT_TARGET_TYPE, destination.pk, destination.name)


def literal_host(url: str) -> bool:
    """Whether the URL's host is an IP literal (judged at save time without DNS)."""
    try:
        ipaddress.ip_address((urlsplit(url).hostname or "").split("%", 1)[0])
    except ValueError:
        return False
    return True


def _url_problem(url: str) -> str | None:
    # The one URL rule (dynamo/urls.py); a destination may carry a query string (Slack-style
    # incoming webhooks put tokens there) and has a column limit of its own.
    if isinstance(url, str) and len(url) > MAX_URL:
        return f"URL must be at most {MAX_URL} characters"
    return url_problem(url, "URL", allow_query=True)


def _clean(values: dict[str, Any], *, instance: NotificationDestination | None = None):
    """Validate a complete set of destination values. Raises ValidationError keyed by field."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValidationError(f"unknown destination fields: {', '.join(sorted(unknown))}")
    errors: dict[str, str] = {}
    clean = dict(values)

    name = str(values.get("name") or "")
    if not _SLUG.match(name):
        errors["name"] = "name must be 1-64 letters, digits, '-' or '_'"
    else:
        taken = NotificationDestination.objects.filter(name=name)
        if instance is not None:
            taken = taken.exclude(pk=instance.pk)
        if taken.exists():
            errors["name"] = f"a destination named {name!r} already exists"

    if values.get("kind") not in DestinationKind.values:
        errors["kind"] = f"kind must be one of {', '.join(DestinationKind.values)}"

    policy = None
    try:
        clean["allowed_networks"] = OutboundPolicy.parse_cidrs(values.get("allowed_networks") or [])
        policy = OutboundPolicy.from_cidrs(clean["allowed_networks"])
    except ValueError as exc:
        errors["allowed_networks"] = str(exc)

    url = values.get("url") or ""
    problem = _url_problem(url)
    if problem is None and policy is not None and literal_host(url):
        outside = policy.violation(url)
        if outside:
            problem = f"URL is outside this destination's allowed networks: {outside}"
    if problem:
        errors["url"] = problem

    events = sorted(set(values.get("events") or []))
    bad = [e for e in events if e not in SUBSCRIBABLE]
    if bad:
        errors["events"] = f"unknown event {bad[0]!r}; choose from {', '.join(SUBSCRIBABLE)}"
    clean["events"] = events
    clean["enabled"] = bool(values.get("enabled", True))
    if errors:
        raise ValidationError(errors)
    return clean


def _audit_view(destination: NotificationDestination) -> dict[str, Any]:
    # The URL of a Slack incoming webhook is its secret; keep only scheme and host.
    parts = urlsplit(destination.url)
    return {
        "name": destination.name,
        "kind": destination.kind,
        "url_host": f"{parts.scheme}://{parts.netloc}",
        "allowed_networks": list(destination.allowed_networks),
        "events": list(destination.events),
        "source": destination.source.name if destination.source is not None else None,
        "enabled": destination.enabled,
    }


def create_notification_destination(
    *,
    actor: Actor,
    name: str,
    kind: str,
    url: str,
    allowed_networks=(),
    events=(),
    source=None,
    enabled: bool = True,
) -> tuple[NotificationDestination, str]:
    """Create a destination with a fresh signing secret; return it with that secret (generic
    webhooks verify with it; Slack ignores it, but keeping one means switching kind later
    never leaves a webhook unsigned)."""
    clean = _clean(
        {
            "name": name,
            "kind": kind,
            "url": url,
            "allowed_networks": allowed_networks,
            "events": list(events),
            "source": source,
            "enabled": enabled,
        }
    )
    secret = generate_secret()
    with transaction.atomic():
        destination = NotificationDestination.objects.create(secret=secret, **clean)
        record(
            AuditAction.NOTIFICATION_DESTINATION_CREATED,
            actor=actor,
            target=_audit_target(destination),
            details=_audit_view(destination),
        )
    return destination, secret


def update_notification_destination(
    destination: NotificationDestination, *, actor: Actor, **changes
) -> NotificationDestination:
    current = {field: getattr(destination, field) for field in FIELDS}
    clean = _clean({**current, **changes}, instance=destination)
    with transaction.atomic():
        locked = NotificationDestination.objects.select_for_update(no_key=True).get(
            pk=destination.pk
        )
        before = _audit_view(locked)
        url_changed = locked.url != clean["url"]
        for field, value in clean.items():
            setattr(locked, field, value)
        locked.save()
        after = _audit_view(locked)
        changed = sorted(k for k in after if after[k] != before[k])
        if url_changed and "url_host" not in changed:
            changed.append("url")
        if changed:
            record(
                AuditAction.NOTIFICATION_DESTINATION_UPDATED,
                actor=actor,
                target=_audit_target(locked),
                details={
                    "changed": changed,
                    "before": {k: before[k] for k in changed if k in before},
                    "after": {k: after[k] for k in changed if k in after},
                },
            )
    destination.refresh_from_db()
    return destination


def regenerate_destination_secret(destination: NotificationDestination, *, actor: Actor) -> str:
    """Replace the signing secret (shown once). Receivers must switch to the new one."""
    secret = generate_secret()
    with transaction.atomic():
        NotificationDestination.objects.filter(pk=destination.pk).update(secret=secret)
        record(
            AuditAction.NOTIFICATION_DESTINATION_UPDATED,
            actor=actor,
            target=_audit_target(destination),
            details={"changed": ["secret"]},
        )
    destination.refresh_from_db()
    return secret


def remove_notification_destination(destination: NotificationDestination, *, actor: Actor) -> None:
    """Delete the destination and its delivery log; the audit log keeps the record."""
    with transaction.atomic():
        record(
            AuditAction.NOTIFICATION_DESTINATION_REMOVED,
            actor=actor,
            target=_audit_target(destination),
            details=_audit_view(destination),
        )
        destination.delete()


def send_test_notification(
    destination: NotificationDestination, *, actor: Actor
) -> NotificationDelivery:
    """Queue a `test` notification to this one destination (not through `notify`, which would
    reach every destination). Delivery runs in Celery like any other; watch the log."""
    if not destination.enabled:
        raise ValidationError("the destination is disabled; enable it to send a test")
    payload = build_payload(NotificationEvent.TEST, reason=f"test sent by {actor.label}")
    with transaction.atomic():
        delivery = NotificationDelivery.objects.create(
            destination=destination, event=NotificationEvent.TEST, payload=payload
        )
        record(
            AuditAction.NOTIFICATION_DESTINATION_TEST_SENT,
            actor=actor,
            target=_audit_target(destination),
            details={"name": destination.name, "delivery_id": delivery.pk},
        )
        enqueue_delivery(delivery.pk)
    return delivery
