"""API token actions (create, revoke) and bearer authentication.

A secret looks like `cpt_<key_id>_<random>`: the key id finds the row with one indexed query,
then the SHA-256 of the whole secret is compared in constant time.

The JSON API authenticates through a `Grant`: what a token may do (its user's permissions,
its sources, its expiry and the hash to check the secret against), kept in Redis for
`GRANT_SECONDS` so that a trainer polling its gate every second costs no query at all. A
revoke replaces the grant with a marker before the row changes and again at commit, and
grants are only ever added where no marker is (SET NX): a request that read the token from
the database just before the revoke cannot put it back, so a revoked token stops working at
once. What changes outside the token (its user's role or active flag) reaches a cached grant
within `GRANT_SECONDS`: short enough to be what a person expects of "now", long enough that a
poller hits the database once per few seconds instead of several times per poll.

A token acting as a single sign-on user keeps the role that user had when it was minted
(`ApiToken.role`) and expires at most `SSO_SESSION_SECONDS` after minting: the provider's groups
are read only at sign-in, so a token must not outlive what a session may. A later sign-in that
maps to a role that cannot do everything the token's role can (or to none) revokes the token
(`withdraw_tokens_above`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import redis
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane import redis_client
from controlplane.accounts.models import ApiToken, SsoIdentity
from controlplane.accounts.roles import ROLE_PERMISSIONS, Role, role_of
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record

PREFIX = "cpt_"
_SECRET = re.compile(r"^cpt_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
#: Recording every use would turn each API read into a write; a minute's precision is plenty.
#: A token served from its cached grant is recorded when the grant is rebuilt (every
#: GRANT_SECONDS while in use), so `last_used_at` stays within a minute and a few seconds.
LAST_USED_PRECISION = timedelta(seconds=60)
#: How long a grant is served from Redis before the database is asked again.
GRANT_SECONDS = 5
#: A grant this close to lapsing is rebuilt by one request (per process and token) while the
#: others keep using it: a token polled by hundreds never lapses into a burst of misses.
GRANT_REFRESH_AHEAD_SECONDS = 1.5
#: How long a revoke's marker keeps grants from being cached again (far longer than any
#: request takes between reading the token and caching its grant).
REVOKED_MARKER_SECONDS = 60
_REVOKED = b"revoked"
_LOADING = [threading.Lock() for _ in range(64)]

logger = logging.getLogger(__name__)


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
    role = ""
    if SsoIdentity.objects.filter(user=user).exists():
        role, expires_at = _sso_bound(user, expires_at)
    token = ApiToken(
        label=label,
        user=user,
        key_id=key_id,
        secret_hash=_hash(secret),
        expires_at=expires_at,
        created_by=actor.label,
        role=role,
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
                **({"role": role} if role else {}),
            },
        )
    return token, secret


def _sso_bound(user, expires_at):
    """(role, expiry) of a new token for a single sign-on user: their role now, and at most
    one session's length (their groups are reread only at their next sign-in)."""
    role = role_of(user)
    if role is None:
        raise ValidationError({"user": f"{user.get_username()} has no role to give a token"})
    ceiling = timezone.now() + timedelta(seconds=settings.SSO_SESSION_SECONDS)
    return role.value, min(expires_at or ceiling, ceiling)


def withdraw_tokens_above(user, role: Role | None, *, actor: Actor) -> int:
    """Revoke `user`'s live tokens whose role can do anything `role` cannot (all for None).

    Called when single sign-on maps the user to `role`; audited per token. Returns how many."""
    allowed = ROLE_PERMISSIONS[role] if role is not None else frozenset()
    live = ApiToken.objects.filter(user=user, revoked_at__isnull=True).exclude(role="")
    withdrawn = 0
    for token in live.select_related("user"):
        if ROLE_PERMISSIONS[Role(token.role)] <= allowed:
            continue
        why = f"single sign-on now gives {user.get_username()} {role.value if role else 'no role'}"
        revoke_token(token, actor=actor, reason=why)
        withdrawn += 1
    return withdrawn


def revoke_token(token: ApiToken, *, actor: Actor, reason: str = "") -> ApiToken:
    # Before the row changes: from now on every request with this token asks the database,
    # which says revoked as soon as this commits. Again at commit, in case a request cached a
    # grant in between (its SET NX lost to the first marker, but belt and braces).
    _block_grant(token.key_id)
    with transaction.atomic():
        transaction.on_commit(lambda: _block_grant(token.key_id))
        updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        token.refresh_from_db()
        if updated:
            record(
                AuditAction.TOKEN_REVOKED,
                actor=actor,
                target=token,
                details={
                    "label": token.label,
                    "user": token.user.get_username(),
                    **({"reason": reason} if reason else {}),
                },
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


@dataclass(frozen=True)
class Grant:
    """What a bearer token may do, as cached: enough to authorize a read without the database."""

    token_id: int
    key_id: str
    label: str
    user_id: int
    secret_hash: str
    superuser: bool
    perms: frozenset[str]
    #: None: every source (as `allowed_source_ids`).
    source_ids: frozenset[int] | None
    #: Seconds since the epoch, or None for no expiry.
    expires_at: float | None
    #: When one request should rebuild the grant from the database (seconds since the epoch).
    refresh_at: float = 0.0

    def due(self, now: float) -> bool:
        return self.refresh_at <= now

    def allows(self, perm: str) -> bool:
        return self.superuser or perm in self.perms

    def accepts(self, secret: str, now: float) -> bool:
        """The secret is this token's and the token has not expired."""
        live = self.expires_at is None or self.expires_at > now
        return live and hmac.compare_digest(self.secret_hash, _hash(secret))

    def encode(self) -> bytes:
        fields = {
            "token_id": self.token_id,
            "key_id": self.key_id,
            "label": self.label,
            "user_id": self.user_id,
            "secret_hash": self.secret_hash,
            "superuser": self.superuser,
            "perms": sorted(self.perms),
            "source_ids": None if self.source_ids is None else sorted(self.source_ids),
            "expires_at": self.expires_at,
            "refresh_at": self.refresh_at,
        }
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | str | None) -> Grant | None:
        """The grant in `raw`; None for a miss, a revoke marker or anything unreadable."""
        if isinstance(raw, str):
            raw = raw.encode()
        if not raw or raw == _REVOKED:
            return None
        try:
            d = json.loads(raw)
            sources = d["source_ids"]
            return cls(
                token_id=int(d["token_id"]),
                key_id=str(d["key_id"]),
                label=str(d["label"]),
                user_id=int(d["user_id"]),
                secret_hash=str(d["secret_hash"]),
                superuser=bool(d["superuser"]),
                perms=frozenset(d["perms"]),
                source_ids=None if sources is None else frozenset(int(s) for s in sources),
                expires_at=None if d["expires_at"] is None else float(d["expires_at"]),
                refresh_at=float(d.get("refresh_at", 0.0)),
            )
        except (ValueError, KeyError, TypeError):
            return None


def key_id_of(secret: str) -> str | None:
    match = _SECRET.match(secret or "")
    return match.group(1) if match else None


def grant_key(key_id: str) -> str:
    return redis_client.key("token", key_id)


def grant_for(secret: str) -> Grant | None:
    """The grant of an active token presented as `secret`, or None (unknown, expired, revoked,
    inactive user). From Redis when cached; otherwise from the database, then cached."""
    key_id = key_id_of(secret)
    if key_id is None:
        return None
    try:
        raw = redis_client.sync_client().get(grant_key(key_id))
    except redis.RedisError:
        logger.warning("token grant unreadable; asking the database", exc_info=True)
        raw = None
    cached = Grant.decode(raw)
    now = time.time()
    loading = _LOADING[hash(key_id) % len(_LOADING)]
    if cached is not None:
        if not cached.accepts(secret, now):
            return None
        if cached.due(now) and loading.acquire(blocking=False):
            try:  # this request rebuilds it; the others carry on with the cached one
                return _load_grant(secret, key_id, replace=True)
            finally:
                loading.release()
        return cached
    # One database read per token and process at a time: when a grant lapses under a burst of
    # polls, the others wait for it and take the grant it cached.
    with loading:
        again = _cached_grant(key_id)
        if again is not None:
            return again if again.accepts(secret, time.time()) else None
        return _load_grant(secret, key_id, replace=False)


def rebuild_grant(secret: str) -> None:
    """Rebuild the cached grant of `secret` from the database, unless this process is already
    at it (the gate API's front path calls this in the background when a grant is due)."""
    key_id = key_id_of(secret)
    if key_id is None:
        return
    loading = _LOADING[hash(key_id) % len(_LOADING)]
    if loading.acquire(blocking=False):
        try:
            _load_grant(secret, key_id, replace=True)
        finally:
            loading.release()


def _cached_grant(key_id: str) -> Grant | None:
    try:
        return Grant.decode(redis_client.sync_client().get(grant_key(key_id)))
    except redis.RedisError:
        return None


# Replace a cached grant, never a revoke's marker (and add one where there is none).
_SET_UNLESS_REVOKED = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
return 1
"""


def _load_grant(secret: str, key_id: str, *, replace: bool) -> Grant | None:
    """The grant from the database, cached: added where nothing is (`replace` False: SET NX,
    so never over a marker nor over a grant another request just cached), or replacing the
    cached grant it rebuilds (`replace` True: never over a marker)."""
    token = authenticate(secret)
    if token is None:
        return None
    grant = _grant_of(token)
    try:
        client = redis_client.sync_client()
        if replace:
            client.eval(
                _SET_UNLESS_REVOKED, 1, grant_key(key_id), _REVOKED, grant.encode(), GRANT_SECONDS
            )
        else:
            client.set(grant_key(key_id), grant.encode(), nx=True, ex=GRANT_SECONDS)
    except redis.RedisError:
        logger.warning("token grant not cached", exc_info=True)
    return grant


def _grant_of(token: ApiToken) -> Grant:
    user = token.user
    sources = allowed_source_ids(token)
    superuser, perms = user.is_superuser, frozenset(user.get_all_permissions())
    if token.role:
        # Never above the role it was minted with, nor above what the user may do now.
        superuser = False
        perms &= {perm.value for perm in ROLE_PERMISSIONS[Role(token.role)]}
    return Grant(
        token_id=token.pk,
        key_id=token.key_id,
        label=token.label,
        user_id=user.pk,
        secret_hash=token.secret_hash,
        superuser=superuser,
        perms=perms,
        source_ids=None if sources is None else frozenset(sources),
        expires_at=token.expires_at.timestamp() if token.expires_at else None,
        refresh_at=time.time() + GRANT_SECONDS - GRANT_REFRESH_AHEAD_SECONDS,
    )


def _block_grant(key_id: str) -> None:
    try:
        redis_client.sync_client().set(grant_key(key_id), _REVOKED, ex=REVOKED_MARKER_SECONDS)
    except redis.RedisError:
        # Redis is away: readers cannot read grants either and go to the database; a grant
        # cached before the failure lapses within GRANT_SECONDS.
        logger.error("could not withdraw the cached grant of token %s", key_id, exc_info=True)
