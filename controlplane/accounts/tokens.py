"""API token actions (create, revoke) and bearer authentication.

A secret looks like `cpt_<key_id>_<random>`: the key id finds the row with one indexed query,
then the SHA-256 of the whole secret is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane.accounts.models import ApiToken
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record

PREFIX = "cpt_"
_SECRET = re.compile(r"^cpt_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
#: Recording every use would turn each API read into a write; a minute's precision is plenty.
LAST_USED_PRECISION = timedelta(seconds=60)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(
    *, user, label: str, actor: Actor, sources=(), expires_days: int | None = None
) -> tuple[ApiToken, str]:
    """Create a token and return it with its secret (the only time the secret exists)."""
    if ApiToken.objects.filter(label=label).exists():
        raise ValidationError({"label": f"a token labelled {label!r} already exists"})
    if expires_days is not None and expires_days < 1:
        raise ValidationError({"expires_days": "expiry must be at least one day"})
    key_id = secrets.token_hex(6)
    secret = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
    token = ApiToken(
        label=label,
        user=user,
        key_id=key_id,
        secret_hash=_hash(secret),
        expires_at=expires_at,
        created_by=actor.label,
    )
    token.full_clean(exclude=["secret_hash", "key_id"])
    sources = list(sources)
    with transaction.atomic():
        token.save()
        token.sources.set(sources)
        record(
            AuditAction.TOKEN_CREATED,
            actor=actor,
            target=token,
            details={
                "label": label,
                "user": user.get_username(),
                "sources": sorted(s.name for s in sources),
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
        )
    return token, secret


def revoke_token(token: ApiToken, *, actor: Actor) -> ApiToken:
    with transaction.atomic():
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        token.refresh_from_db()
        if updated:
            record(
                AuditAction.TOKEN_REVOKED,
                actor=actor,
                target=token,
                details={"label": token.label, "user": token.user.get_username()},
            )
    return token


def authenticate(secret: str) -> ApiToken | None:
    """The active token for a presented secret, or None. Records last use at most once a minute."""
    match = _SECRET.match(secret or "")
    if match is None:
        return None
    token = ApiToken.objects.select_related("user").filter(key_id=match.group(1)).first()
    if token is None or not hmac.compare_digest(token.secret_hash, _hash(secret)):
        return None
    now = timezone.now()
    if token.revoked_at is not None or (token.expires_at is not None and token.expires_at <= now):
        return None
    if not token.user.is_active:
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_PRECISION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def allowed_source_ids(token: ApiToken | None) -> set[int] | None:
    """Source ids a token is limited to, or None for no limit (session users, unlimited tokens)."""
    if token is None:
        return None
    ids = {s for s in token.sources.values_list("pk", flat=True)}
    return ids or None
