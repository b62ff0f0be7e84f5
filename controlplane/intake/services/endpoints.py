"""Webhook endpoint actions: create, update, remove, secret rotation, and the test event.

Rotation is two steps so no trainer is cut off mid-flight: `add_webhook_secret` lists a new
secret next to the old ones (a signature by any of them verifies), and once every sender signs
with the new one, `remove_webhook_secret` drops the old. Secrets never appear in audit rows;
they are named there by a short fingerprint.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.intake.models import WebhookEndpoint, WebhookPolicy
from controlplane.intake.webhooks.trainer.events import validate_rules
from controlplane.intake.webhooks.trainer.receive import Answer, send_test_event
from controlplane.notify.signing import generate_secret
from controlplane.refresh.strategy import parse_strategy
from controlplane.refresh.targets import KEEPING_MODES, PAUSE_MODE_CHOICES

#: `WebhookEndpoint.secrets`: the endpoint's `whsec_` signing secrets, newest first (a
#: signature by any of them verifies); shown and audited only by fingerprint.
Secrets = list[str]

#: Old and new during a rotation, plus room for a slow rollout; more means a forgotten secret.
MAX_SECRETS = 3
#: Every family's modes (`auto` = each family's default, the one that works on any fleet);
#: the refresh actions check a mode against each worker's family again when planning.
PAUSE_MODES = PAUSE_MODE_CHOICES
_SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,199}$")
FIELDS = (
    "name",
    "source",
    "namespaces",
    "policy",
    "rules",
    "pause_mode",
    "inflight_may_straddle",
    "default_strategy",
    "allow_strategy_override",
    "enabled",
)


def secret_fingerprint(secret: str) -> str:
    """A short, stable name for a secret that reveals nothing useful about it."""
    return hashlib.sha256(secret.encode()).hexdigest()[:12]


def _clean(values: dict[str, Any], *, instance: WebhookEndpoint | None = None) -> dict[str, Any]:
    """Validate a complete set of endpoint values. Raises ValidationError keyed by field."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValidationError(f"unknown webhook endpoint fields: {', '.join(sorted(unknown))}")
    errors: dict[str, str] = {}
    clean = dict(values)

    name = str(values.get("name") or "")
    if not _SLUG.match(name):
        errors["name"] = "name must be 1-64 letters, digits, '-' or '_'"
    else:
        taken = WebhookEndpoint.objects.filter(name=name)
        if instance is not None:
            taken = taken.exclude(pk=instance.pk)
        if taken.exists():
            errors["name"] = f"a webhook endpoint named {name!r} already exists"

    if values.get("source") is None:
        errors["source"] = "a source is required"

    namespaces = values.get("namespaces") or []
    if isinstance(namespaces, str):
        namespaces = re.split(r"[\s,]+", namespaces)
    namespaces = sorted({str(ns).strip() for ns in namespaces if str(ns).strip()})
    bad = [ns for ns in namespaces if not _NAMESPACE.match(ns)]
    if bad:
        errors["namespaces"] = f"{bad[0]!r} is not a namespace name"
    clean["namespaces"] = namespaces

    policy = values.get("policy") or WebhookPolicy.REQUIRE_APPROVAL
    if policy not in WebhookPolicy.values:
        errors["policy"] = f"policy must be one of {', '.join(WebhookPolicy.values)}"
    clean["policy"] = policy

    try:
        clean["rules"] = validate_rules(values.get("rules") or [])
    except ValueError as exc:
        errors["rules"] = f"rules: {exc}"

    pause_mode = values.get("pause_mode") or "auto"
    if pause_mode not in PAUSE_MODES:
        errors["pause_mode"] = f"pause mode must be one of {', '.join(PAUSE_MODES)}"
    clean["pause_mode"] = pause_mode
    clean["inflight_may_straddle"] = bool(values.get("inflight_may_straddle", False))
    if pause_mode in KEEPING_MODES and not clean["inflight_may_straddle"]:
        errors["inflight_may_straddle"] = (
            f"pause mode {pause_mode} keeps the requests in flight across the update (their "
            "samples span two policies): declare that they may straddle it, or choose wait or "
            "abort"
        )
    strategy = values.get("default_strategy") or {}
    try:
        # Stored in its normal form; empty stays empty (the source's default applies).
        clean["default_strategy"] = parse_strategy(strategy).to_dict() if strategy else {}
    except ValidationError as exc:
        errors["default_strategy"] = "; ".join(exc.messages)
    clean["allow_strategy_override"] = bool(values.get("allow_strategy_override", False))
    clean["enabled"] = bool(values.get("enabled", True))
    if errors:
        raise ValidationError(errors)
    return clean


def _audit_view(endpoint: WebhookEndpoint) -> dict[str, Any]:
    return {
        "name": endpoint.name,
        "source": endpoint.source.name,
        "namespaces": list(endpoint.namespaces),
        "policy": endpoint.policy,
        "rules": list(endpoint.rules),
        "pause_mode": endpoint.pause_mode,
        "inflight_may_straddle": endpoint.inflight_may_straddle,
        "default_strategy": dict(endpoint.default_strategy or {}),
        "allow_strategy_override": endpoint.allow_strategy_override,
        "enabled": endpoint.enabled,
        "secrets": [secret_fingerprint(s) for s in endpoint.secrets],
    }


def create_webhook_endpoint(
    *,
    actor: Actor,
    name: str,
    source,
    namespaces=(),
    policy: str = WebhookPolicy.REQUIRE_APPROVAL,
    rules=(),
    pause_mode: str = "auto",
    inflight_may_straddle: bool = False,
    default_strategy: dict[str, Any] | None = None,
    allow_strategy_override: bool = False,
    enabled: bool = True,
) -> tuple[WebhookEndpoint, str]:
    """Create an endpoint with a fresh `whsec_` secret; return it with that secret."""
    clean = _clean(
        {
            "name": name,
            "source": source,
            "namespaces": namespaces,
            "policy": policy,
            "rules": list(rules),
            "pause_mode": pause_mode,
            "inflight_may_straddle": inflight_may_straddle,
            "default_strategy": default_strategy or {},
            "allow_strategy_override": allow_strategy_override,
            "enabled": enabled,
        }
    )
    secret = generate_secret()
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.create(secrets=[secret], **clean)
        record(
            AuditAction.WEBHOOK_ENDPOINT_CREATED,
            actor=actor,
            target=endpoint,
            details=_audit_view(endpoint),
        )
    return endpoint, secret


def update_webhook_endpoint(
    endpoint: WebhookEndpoint, *, actor: Actor, **changes
) -> WebhookEndpoint:
    """Change any of name, source, namespaces, policy, rules, pause mode, default strategy,
    whether webhooks may override it, enabled."""
    current = {field: getattr(endpoint, field) for field in FIELDS}
    clean = _clean({**current, **changes}, instance=endpoint)
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update(no_key=True).get(pk=endpoint.pk)
        before = _audit_view(locked)
        for field, value in clean.items():
            setattr(locked, field, value)
        locked.save()
        after = _audit_view(locked)
        changed = sorted(k for k in after if after[k] != before[k])
        if changed:
            record(
                AuditAction.WEBHOOK_ENDPOINT_UPDATED,
                actor=actor,
                target=locked,
                details={
                    "changed": changed,
                    "before": {k: before[k] for k in changed},
                    "after": {k: after[k] for k in changed},
                },
            )
    endpoint.refresh_from_db()
    return endpoint


def remove_webhook_endpoint(endpoint: WebhookEndpoint, *, actor: Actor) -> None:
    """Delete the endpoint and what it received; the audit log keeps the record."""
    with transaction.atomic():
        details = _audit_view(endpoint)
        record(
            AuditAction.WEBHOOK_ENDPOINT_REMOVED,
            actor=actor,
            target=endpoint,
            details=details,
        )
        endpoint.delete()


def add_webhook_secret(endpoint: WebhookEndpoint, *, actor: Actor) -> str:
    """Start a rotation: list a new secret first (test events sign with it), keep the old ones."""
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update(no_key=True).get(pk=endpoint.pk)
        if len(locked.secrets) >= MAX_SECRETS:
            raise ValidationError(
                f"this endpoint already has {len(locked.secrets)} secrets; remove an old one "
                "before adding another"
            )
        secret = generate_secret()
        locked.secrets = [secret, *locked.secrets]
        locked.save(update_fields=["secrets", "updated_at"])
        record(
            AuditAction.WEBHOOK_ENDPOINT_UPDATED,
            actor=actor,
            target=locked,
            details={
                "changed": ["secrets"],
                "secret_added": secret_fingerprint(secret),
                "secrets": [secret_fingerprint(s) for s in locked.secrets],
            },
        )
    endpoint.refresh_from_db()
    return secret


def remove_webhook_secret(endpoint: WebhookEndpoint, *, actor: Actor, fingerprint: str) -> None:
    """Finish a rotation by dropping one secret, named by its fingerprint. The last secret
    cannot be removed: an endpoint without one could never verify anything."""
    with transaction.atomic():
        locked = WebhookEndpoint.objects.select_for_update(no_key=True).get(pk=endpoint.pk)
        keep = [s for s in locked.secrets if secret_fingerprint(s) != fingerprint]
        if len(keep) == len(locked.secrets):
            raise ValidationError("this endpoint has no secret with that fingerprint")
        if not keep:
            raise ValidationError("an endpoint needs at least one secret; add a new one first")
        locked.secrets = keep
        locked.save(update_fields=["secrets", "updated_at"])
        record(
            AuditAction.WEBHOOK_ENDPOINT_UPDATED,
            actor=actor,
            target=locked,
            details={
                "changed": ["secrets"],
                "secret_removed": fingerprint,
                "secrets": [secret_fingerprint(s) for s in keep],
            },
        )
    endpoint.refresh_from_db()


def send_test_webhook_event(endpoint: WebhookEndpoint, *, actor: Actor) -> Answer:
    """Push a signed `test.ping` through the real receive path, and record who pressed it.

    The receive path audits the delivery itself as the webhook (`webhook.accepted` or
    `webhook.rejected`); this row names the person behind it and how it was answered.
    """
    answer = send_test_event(endpoint)
    error = answer.body.get("error") or {}
    record(
        AuditAction.WEBHOOK_ENDPOINT_TEST_SENT,
        actor=actor,
        target=endpoint,
        details={
            "name": endpoint.name,
            "status": answer.status,
            "outcome": answer.body.get("outcome"),
            "error": error.get("code"),
            "webhook_id": answer.body.get("webhook_id"),
        },
    )
    return answer
