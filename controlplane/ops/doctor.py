"""`manage.py doctor`'s checks: is this deployment able to do its job right now?

Each check returns findings with a status: `ok`, `warn` (works, but look at it) or `fail`
(something an operator must fix). The probes of /readyz (controlplane/health.py) are reused
for the database, Redis and Celery, so the command and the load balancer agree.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.core import checks as django_checks
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from controlplane import health
from controlplane.dynamo.discovery import fetch_discovery
from controlplane.dynamo.errors import DiscoveryError
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet.models import Source
from controlplane.ops import heartbeat

OK, WARN, FAIL = "ok", "warn", "fail"
#: A clock this far off is worth a warning even though webhooks still verify.
CLOCK_WARN_SECONDS = 2.0


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str


def _from_probe(name: str, result: health.CheckResult, ok_detail: str) -> Finding:
    if result.ok:
        return Finding(name, OK, f"{ok_detail} ({result.milliseconds:g} ms)")
    return Finding(name, FAIL, result.detail)


def check_settings() -> Iterator[Finding]:
    """Django's system checks (with the deployment ones in production) and our own."""
    messages = [
        message
        for message in django_checks.run_checks(include_deployment_checks=settings.PRODUCTION)
        if not message.is_silenced()
    ]
    for message in messages:
        status = FAIL if message.level >= django_checks.ERROR else WARN
        yield Finding("settings", status, f"{message.id}: {message.msg}")
    anchor_dir = settings.AUDIT_ANCHOR_FILE.parent
    if not (anchor_dir.is_dir() and os.access(anchor_dir, os.W_OK)):
        yield Finding(
            "settings",
            WARN if not settings.PRODUCTION else FAIL,
            f"AUDIT_ANCHOR_FILE's directory {anchor_dir} is not writable here: a worker"
            " running the checkpoint task from this image could not write checkpoints",
        )
    public_host = urlsplit(settings.PUBLIC_BASE_URL).hostname or ""
    if settings.PRODUCTION and not _host_allowed(public_host):
        yield Finding(
            "settings", WARN, f"PUBLIC_BASE_URL's host {public_host!r} is not in ALLOWED_HOSTS"
        )
    if not messages:
        yield Finding("settings", OK, f"{settings.CONTROLPLANE_ENV} settings pass Django's checks")


def _host_allowed(host: str) -> bool:
    for pattern in settings.ALLOWED_HOSTS:
        if pattern == "*" or pattern == host:
            return True
        if pattern.startswith(".") and (host == pattern[1:] or host.endswith(pattern)):
            return True
    return False


def check_database() -> Iterator[Finding]:
    probe = health.check_database()
    yield _from_probe("database", probe, f"{connection.vendor} answers")
    if not probe.ok:
        return
    executor = MigrationExecutor(connection)
    unapplied = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if unapplied:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in unapplied[:5])
        yield Finding("database", FAIL, f"{len(unapplied)} unapplied migrations ({names}…)")


def check_redis() -> Iterator[Finding]:
    yield _from_probe("redis", health.check_redis(), "Redis answers PING")


def check_celery() -> Iterator[Finding]:
    probe = health.check_celery(count_all=True)
    yield _from_probe("celery", probe, f"{probe.extra.get('workers', 0)} worker(s) answered")


def check_beat() -> Iterator[Finding]:
    age = heartbeat.age_seconds()
    limit = heartbeat.stale_after_seconds()
    if age is None:
        yield Finding("beat", FAIL, "no heartbeat ever: beat (or every worker) has not run")
    elif age > limit:
        yield Finding(
            "beat",
            FAIL,
            f"last heartbeat {age:.0f}s ago (limit {limit:g}s): beat is down, or no worker runs"
            " its tasks",
        )
    else:
        yield Finding("beat", OK, f"last heartbeat {max(age, 0):.0f}s ago")


def check_sources(timeout: float | None = None) -> Iterator[Finding]:
    """Each enabled source's listener, called as discovery calls it (same outbound policy)."""
    sources = list(Source.objects.order_by("name"))
    if not sources:
        yield Finding("sources", WARN, "no source registered (manage.py source add …)")
        return
    deadline = timeout or settings.DISCOVERY_LISTENER_TIMEOUT_SECONDS
    enabled = [s for s in sources if s.enabled]
    results = asyncio.run(_probe_listeners(enabled, deadline)) if enabled else {}
    for source in sources:
        name = f"source {source.name}"
        if not source.enabled:
            yield Finding(name, OK, "disabled: not checked")
            continue
        problem, workers = results[source.pk]
        if problem:
            yield Finding(name, FAIL, problem)
        else:
            yield Finding(name, OK, f"listener answers: {workers} worker(s)")


async def _probe_listeners(
    sources: list[Source], timeout: float
) -> dict[int, tuple[str | None, int]]:
    async def one(client, source: Source) -> tuple[str | None, int]:
        try:
            policy = OutboundPolicy.from_cidrs(source.allowed_networks)
        except ValueError as exc:
            return f"allowed networks: {exc}", 0
        try:
            result = await fetch_discovery(client, policy, source.listener_url, timeout=timeout)
        except DiscoveryError as exc:
            return exc.reason, 0
        return None, len(result.workers)

    async with make_client(timeout=timeout) as client:
        answers = await asyncio.gather(*(one(client, s) for s in sources))
    return {s.pk: answer for s, answer in zip(sources, answers, strict=True)}


def check_clock() -> Iterator[Finding]:
    """This host's clock against the database's and Redis's.

    Trainer webhooks carry a signed timestamp that must fall within WEBHOOK_TOLERANCE_SECONDS
    of our clock: a skew of half the window already rejects trainers whose clock errs the
    other way. Each reading is taken against the midpoint of its round trip.
    """
    window = settings.WEBHOOK_TOLERANCE_SECONDS
    readings: list[tuple[str, float]] = []
    try:
        readings.append(("database", _skew(_database_time)))
    except Exception as exc:
        yield Finding("clock", WARN, f"database time unreadable: {type(exc).__name__}")
    try:
        readings.append(("redis", _skew(_redis_time)))
    except Exception as exc:
        yield Finding("clock", WARN, f"redis time unreadable: {type(exc).__name__}")
    for against, skew in readings:
        text = f"{skew:+.2f}s against {against} (webhook window ±{window}s)"
        if abs(skew) >= window / 2:
            yield Finding("clock", FAIL, text + ": signed webhooks will be refused")
        elif abs(skew) >= CLOCK_WARN_SECONDS:
            yield Finding("clock", WARN, text)
        else:
            yield Finding("clock", OK, text)


def _skew(read: Callable[[], float]) -> float:
    before = time.time()
    remote = read()
    after = time.time()
    return (before + after) / 2 - remote


def _database_time() -> float:
    if connection.vendor == "postgresql":
        sql = "SELECT EXTRACT(EPOCH FROM clock_timestamp())"
    else:  # SQLite shares this host's clock; still a useful smoke test of the query path
        sql = "SELECT (julianday('now') - 2440587.5) * 86400.0"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return float(cursor.fetchone()[0])


def _redis_time() -> float:
    timeout = settings.READINESS_TIMEOUT_SECONDS
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=timeout, socket_timeout=timeout
    )
    try:
        seconds, micros = client.time()
    finally:
        client.close()
    return seconds + micros / 1e6


CHECKS: dict[str, Callable[[], Iterator[Finding]]] = {
    "settings": check_settings,
    "database": check_database,
    "redis": check_redis,
    "celery": check_celery,
    "beat": check_beat,
    "sources": check_sources,
    "clock": check_clock,
}


def run(names: list[str] | None = None) -> list[Finding]:
    findings: list[Finding] = []
    for name in names or list(CHECKS):
        findings.extend(CHECKS[name]())
    return findings


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
