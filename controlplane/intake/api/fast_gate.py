"""The gate poll answered in front of Django, from Redis alone.

Rollout frameworks poll `GET /api/v1/gates/<source>/<namespace>` with a bearer token, every
second, by the hundred. Through Django each poll runs the whole middleware stack, Ninja's
routing and a worker thread of its own; this ASGI wrapper answers the common case itself with
one Redis round trip (the token's grant and the gate's copy, one MGET) and one shared
revision read and the same bytes and
headers Django would send (`tests/api/test_fast_gate.py` compares the two).

It answers only when everything is certain: a well-formed bearer token whose cached grant
accepts the secret, allows viewing and covers the gate's source, a gate copy in Redis at the
revision the gate row has committed (checked by a database read that began after the poll
arrived, shared with the other polls of the moment: `gate_revisions`), an allowed Host, and
no redirect due. A grant or copy missing from Redis is first loaded from the
database, once per process in a worker thread, while the polls that missed it wait. Anything
else — a revoked, unknown or expired token, a limited token asking for another source, a gate
the database does not have, Redis away — goes to Django unchanged, which answers from the
database: errors, refusals and their bodies stay Django's.
A grant or copy about to lapse is rebuilt from the database in a worker thread (once a second
per process at most) while the polls go on being answered here: a polled gate never lapses.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, NamedTuple

import redis
from django.conf import settings
from django.core.signals import setting_changed
from django.db import connections
from django.http.request import split_domain_port, validate_host
from django.utils.csp import CSP, build_policy

from controlplane import redis_client
from controlplane.accounts import tokens
from controlplane.accounts.roles import Perm
from controlplane.intake.api.gate_revisions import committed_revision
from controlplane.intake.api.gates import (
    CACHE_CONTROL,
    JSON_CONTENT_TYPE,
    etag_for,
    not_modified,
    rebuild_copy,
    rendered_copy,
)
from controlplane.refresh import gate_cache

Scope = MutableMapping[str, Any]
ASGIApp = Callable[..., Awaitable[None]]

logger = logging.getLogger(__name__)

GATE_PATH = re.compile(r"^/api/v1/gates/([^/]+)/([^/]+)$")
#: As `audit.middleware.CorrelationIdMiddleware` accepts an offered `X-Request-ID`.
_ACCEPTABLE_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._-]{8,64}$")


def wrap(django_app: ASGIApp) -> ASGIApp:
    async def app(scope: Scope, receive, send) -> None:
        answer = await _answer(scope) if _candidate(scope) else None
        if answer is None:
            await django_app(scope, receive, send)
            return
        status, headers, body = answer
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def _candidate(scope: Scope) -> bool:
    return (
        scope["type"] == "http"
        and scope["method"] == "GET"
        and not scope.get("root_path")
        and GATE_PATH.match(scope["path"]) is not None
    )


async def _answer(scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
    path = GATE_PATH.match(scope["path"])
    assert path is not None
    source, namespace = path.groups()
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in headers:  # a repeated header: Django joins them; let it
            return None
        headers[name] = value
    secure = _is_secure(scope, headers)
    config = _config()
    if config.defer or not _host_allowed(headers) or (config.ssl_redirect and not secure):
        return None
    secret = _bearer_secret(headers.get(b"authorization", b""))
    key_id = tokens.key_id_of(secret) if secret is not None else None
    if secret is None or key_id is None:
        return None
    grant_key, gate_key = tokens.grant_key(key_id), gate_cache.gate_key(source, namespace)
    client = redis_client.async_client()
    try:
        raw_grant, raw_gate = await client.mget(grant_key, gate_key)
        # Not cached (yet, or lapsed while nobody polled): one load per process from the
        # database in a worker thread, awaited by every poll that missed meanwhile, instead of
        # a burst of polls through Django. A token the database refuses stays uncached (and a
        # revoke's marker is no miss): Django answers those, and no gate is loaded for them.
        if raw_grant is None:
            await _load_once(key_id, tokens.grant_for, secret)
            raw_grant = await client.get(grant_key)
            if raw_grant is None:
                return None
        if raw_gate is None:
            await _load_once(f"{source}/{namespace}", rebuild_copy, source, namespace)
            raw_gate = await client.get(gate_key)
    except redis.RedisError:
        return None
    # The client returns bytes (no decode_responses); the types allow str too.
    grant = _decoded_grant(raw_grant if isinstance(raw_grant, bytes) else None)
    cached = _decoded_gate(raw_gate if isinstance(raw_gate, bytes) else None)
    now = time.time()
    if (
        grant is None
        or cached is None
        or not grant.accepts(secret, now)
        or not grant.allows(Perm.VIEW)
        or (grant.source_ids is not None and cached.source_id not in grant.source_ids)
    ):
        return None
    # The copy is a hint: only at the revision the row has committed now (read after this poll
    # arrived) is it the answer. Otherwise, or when the database cannot say, Django answers
    # from the row and primes the copy.
    if not gate_cache.is_current(cached, await committed_revision(source, namespace)):
        return None
    # About to lapse: rebuilt from the database in a thread, while this request is answered.
    if grant.due(now) and _claim(key_id, now):
        _in_background(tokens.rebuild_grant, secret)
    if cached.due(now) and _claim(f"{source}/{namespace}", now):
        _in_background(rebuild_copy, source, namespace)
    etag = etag_for(cached.source_id, namespace, cached.revision, cached.mark)
    offered = headers.get(b"if-none-match", b"").decode("latin-1")
    if not_modified(offered, etag):
        status, body, content_type = 304, b"", b"text/html; charset=utf-8"
    else:
        status, content_type = 200, JSON_CONTENT_TYPE.encode()
        body = rendered_copy(source, namespace, cached)
    request_id = headers.get(b"x-request-id", b"")
    if not _ACCEPTABLE_REQUEST_ID.match(request_id):
        # `correlation.new_correlation_id`'s shape (32 hex digits) without building a UUID.
        request_id = os.urandom(16).hex().encode()
    response_headers = [
        (b"content-type", content_type),
        (b"etag", etag.encode()),
        (b"cache-control", CACHE_CONTROL.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id),
        *_security_headers(secure),
    ]
    return status, response_headers, body


# Decoding a grant or a gate copy costs more than the rest of the answer: the last few of
# each are kept, keyed by the exact bytes read from Redis (so a changed value is decoded anew).
_grants: dict[bytes, tokens.Grant | None] = {}
_gates: dict[bytes, gate_cache.CachedGate | None] = {}
_DECODED_MAX = 1024


def _decoded_grant(raw: bytes | None) -> tokens.Grant | None:
    if raw is None:
        return None
    if raw not in _grants:
        if len(_grants) >= _DECODED_MAX:
            _grants.clear()
        _grants[raw] = tokens.Grant.decode(raw)
    return _grants[raw]


def _decoded_gate(raw: bytes | None) -> gate_cache.CachedGate | None:
    if raw is None:
        return None
    if raw not in _gates:
        if len(_gates) >= _DECODED_MAX:
            _gates.clear()
        _gates[raw] = gate_cache.decode(raw)
    return _gates[raw]


_claimed: dict[str, float] = {}
_background: set[asyncio.Future] = set()


def _claim(what: str, now: float) -> bool:
    """True at most once a second per process for `what` (a token or a gate)."""
    if now - _claimed.get(what, 0.0) < 1.0:
        return False
    if len(_claimed) >= _DECODED_MAX:
        _claimed.clear()
    _claimed[what] = now
    return True


_loading: dict[str, asyncio.Future] = {}


def _in_thread(rebuild: Callable[..., object], *args: str) -> asyncio.Future:
    """Run a database load in the loop's thread pool (its connection returned afterwards)."""

    def job() -> None:
        try:
            rebuild(*args)
        except Exception:
            logger.exception("loading a cached grant or gate copy failed")
        finally:
            connections.close_all()  # this thread's connection goes back to the pool

    return asyncio.get_running_loop().run_in_executor(None, job)


def _in_background(rebuild: Callable[..., object], *args: str) -> None:
    """Start a load without waiting for it."""
    future = _in_thread(rebuild, *args)
    _background.add(future)
    future.add_done_callback(_background.discard)


async def _load_once(what: str, load: Callable[..., object], *args: str) -> None:
    """Run `load` once for `what` however many polls ask meanwhile; each awaits the same one."""
    future = _loading.get(what)
    if future is None:
        future = _loading[what] = _in_thread(load, *args)
        future.add_done_callback(lambda _: _loading.pop(what, None))
    await asyncio.shield(future)


def _bearer_secret(header: bytes) -> str | None:
    # As `auth.BearerToken`: anything but "Bearer <secret>" is Django's to refuse.
    scheme, _, secret = header.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()


def _is_secure(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    """As `HttpRequest.scheme`: the proxy's header when configured, else the connection."""
    proxy_header = _config().proxy_ssl_header
    if proxy_header is not None:
        name, secure_value = proxy_header
        value = headers.get(name)
        if value is not None:
            return value.decode("latin-1").split(",", 1)[0].strip() == secure_value
    return scope.get("scheme") == "https"


def _host_allowed(headers: dict[bytes, bytes]) -> bool:
    """As `HttpRequest.get_host` for a request with a Host header (else Django decides)."""
    if b"host" not in headers:
        return False
    return _valid_host(headers[b"host"])


@functools.lru_cache(maxsize=256)
def _valid_host(host: bytes) -> bool:
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _ = split_domain_port(host.decode("latin-1"))
    return bool(domain) and validate_host(domain, allowed)


class _Config(NamedTuple):
    #: Settings under which Django's middleware may answer otherwise: CommonMiddleware's
    #: www-redirect and user-agent refusals, hosts taken from X-Forwarded-Host.
    defer: bool
    ssl_redirect: bool
    proxy_ssl_header: tuple[bytes, str] | None


@functools.cache
def _config() -> _Config:
    proxy = settings.SECURE_PROXY_SSL_HEADER
    return _Config(
        defer=bool(
            settings.PREPEND_WWW or settings.DISALLOWED_USER_AGENTS or settings.USE_X_FORWARDED_HOST
        ),
        ssl_redirect=bool(settings.SECURE_SSL_REDIRECT),
        proxy_ssl_header=(
            (proxy[0].removeprefix("HTTP_").replace("_", "-").lower().encode(), proxy[1])
            if proxy
            else None
        ),
    )


@functools.cache
def _security_headers(secure: bool) -> tuple[tuple[bytes, bytes], ...]:
    """What the security, CSP and clickjacking middleware add to an API response."""
    found: list[tuple[str, str]] = []
    if settings.X_FRAME_OPTIONS:
        found.append(("x-frame-options", settings.X_FRAME_OPTIONS.upper()))
    for header, config in (
        (CSP.HEADER_ENFORCE, settings.SECURE_CSP),
        (CSP.HEADER_REPORT_ONLY, settings.SECURE_CSP_REPORT_ONLY),
    ):
        if config:
            found.append((str(header).lower(), build_policy(config, None)))
    if settings.SECURE_HSTS_SECONDS and secure:
        sts = f"max-age={settings.SECURE_HSTS_SECONDS}"
        if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
            sts += "; includeSubDomains"
        if settings.SECURE_HSTS_PRELOAD:
            sts += "; preload"
        found.append(("strict-transport-security", sts))
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        found.append(("x-content-type-options", "nosniff"))
    policy = settings.SECURE_REFERRER_POLICY
    if policy:
        values = [v.strip() for v in policy.split(",")] if isinstance(policy, str) else policy
        found.append(("referrer-policy", ",".join(values)))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        found.append(("cross-origin-opener-policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY))
    return tuple((k.encode(), v.encode("latin-1")) for k, v in found)


def _settings_changed(**kwargs) -> None:
    _config.cache_clear()
    _security_headers.cache_clear()
    _valid_host.cache_clear()


setting_changed.connect(_settings_changed)
