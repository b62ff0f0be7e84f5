"""Liveness and readiness: `/healthz` and `/readyz`, for load balancers and Kubernetes probes.

- `/healthz` says the process answers. It touches nothing else, so a database outage never
  makes an orchestrator restart every web process (which would not fix the database).
- `/readyz` says this process can serve: PostgreSQL answers (a pool busy with other requests
  is not a failure), and Redis answers. 503 with a JSON body that names what failed
  otherwise. It also reports whether a Celery worker answers a broadcast ping, under
  `degraded` when none does, without failing: see `readiness_checks` for why each check
  counts or not. The result is kept for READINESS_CACHE_SECONDS in this process, and only
  one check runs at a time, so probes from several sources stay cheap.

Both are answered by a middleware placed first, before SecurityMiddleware: a probe reaches the
pod by its IP over plain HTTP, so host validation (ALLOWED_HOSTS), the HTTPS redirect and the
sign-in requirement must not apply to them. They reveal nothing but which dependency failed
(the reason's exception type, never its message: that may name internal hosts).

`manage.py doctor` reuses the same checks (`check_database`, `check_redis`, `check_celery`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from kombu import Connection, Producer, pidbox
from psycopg_pool import ConnectionPool, PoolTimeout

from controlplane.celery import app as celery_app

logger = logging.getLogger(__name__)

LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    # JSON only: nothing here may load or run anything.
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
}


@dataclass
class CheckResult:
    ok: bool
    detail: str = ""
    milliseconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class CheckFailed(Exception):
    """A check's own verdict (as opposed to an exception from a client library)."""


def _timed(check: Callable[[], dict[str, Any] | None]) -> CheckResult:
    started = time.monotonic()
    try:
        extra = check() or {}
    except CheckFailed as exc:
        return CheckResult(False, str(exc), _ms(started))
    except Exception as exc:
        logger.warning("readiness check failed: %s", exc, exc_info=False)
        return CheckResult(False, type(exc).__name__, _ms(started))
    return CheckResult(True, "", _ms(started), extra)


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


#: How long the readiness probe waits for a pooled connection before it asks the database
#: directly: short, since a pool this busy is answered "busy", not waited for.
POOL_WAIT_SECONDS = 0.5


def check_database(timeout: float | None = None) -> CheckResult:
    """PostgreSQL answers `SELECT 1`; a busy connection pool is not a failure.

    Readiness says whether *this process* can serve. A pool whose connections are all lent
    out to requests says nothing of the kind: the next request queues for a connection
    (`DATABASE_POOL_TIMEOUT_SECONDS`) and gets one. Taking a pool connection the way a request
    does, as this check did, waited out that timeout whenever long requests filled the pool,
    and answered 503: a load balancer then took every web pod out at once.

    So the probe waits `POOL_WAIT_SECONDS` at most for a pooled connection. If none comes, it
    tells "pool busy" from "database unreachable" with one connection of its own, outside the
    pool, bounded by `timeout`: it connects, the database is there (ready, reported `busy`);
    it does not, the database is unreachable (503). The pool's own figures cannot tell: a
    pool retrying connections to a dead database counts them as its own, like lent ones. The
    extra connection is opened only while the pool is exhausted, once per
    READINESS_CACHE_SECONDS per process at most (one check at a time, see `_ReadinessCache`):
    keep one connection per web process spare in the budget (settings, DATABASE_POOL_*).
    """
    timeout = timeout if timeout is not None else settings.READINESS_TIMEOUT_SECONDS
    pool = getattr(connection, "pool", None)  # None: SQLite, or a Celery process (no pool)

    def select_one(conn: Any) -> None:
        if conn.execute("SELECT 1").fetchone() != (1,):
            raise CheckFailed("SELECT 1 returned something else")

    def run_unpooled() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            if cursor.fetchone() != (1,):
                raise CheckFailed("SELECT 1 returned something else")

    def run_pooled(pool: ConnectionPool) -> dict[str, Any]:
        try:
            with pool.connection(timeout=min(POOL_WAIT_SECONDS, timeout)) as conn:
                select_one(conn)
            return {}
        except PoolTimeout:
            pass
        kwargs = pool.kwargs() if callable(pool.kwargs) else dict(pool.kwargs or {})
        # libpq counts whole seconds and treats less than 2 as 2.
        kwargs["connect_timeout"] = max(2, math.ceil(timeout))
        conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
        with psycopg.connect(conninfo or "", **kwargs) as conn:
            select_one(conn)
        stats = pool.get_stats()
        return {"pool": "busy", "pool_size": stats.get("pool_size"), "max": pool.max_size}

    if pool is None:
        return _timed(run_unpooled)
    return _timed(lambda: run_pooled(pool))


def check_redis(url: str | None = None, timeout: float | None = None) -> CheckResult:
    timeout = timeout if timeout is not None else settings.READINESS_TIMEOUT_SECONDS

    def run() -> None:
        client = redis.Redis.from_url(
            url or settings.REDIS_URL, socket_connect_timeout=timeout, socket_timeout=timeout
        )
        try:
            client.ping()
        finally:
            client.close()

    return _timed(run)


class _OneShotProducer(Producer):
    """Publishes once: a probe must fail fast, not wait (kombu's default) for the broker."""

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["retry"] = False
        return super().publish(*args, **kwargs)


class _ProbeMailbox(pidbox.Mailbox):
    """Celery's control mailbox, publishing on the probe's own connection.

    Celery's `app.control` publishes through the app's producer pool, bound to whichever
    broker the app first connected to and retrying forever while it is down.
    """

    @contextmanager
    def producer_or_acquire(self, producer: Any = None, channel: Any = None) -> Iterator[Any]:
        yield _OneShotProducer(channel, auto_declare=False)


def _mailbox() -> _ProbeMailbox:
    conf = celery_app.conf
    return _ProbeMailbox(
        conf.control_exchange,
        type="fanout",
        accept=conf.accept_content,
        serializer=conf.task_serializer,
        queue_ttl=conf.control_queue_ttl,
        reply_queue_ttl=conf.control_queue_ttl,
        queue_expires=conf.control_queue_expires,
        reply_queue_expires=conf.control_queue_expires,
    )


def check_celery(timeout: float | None = None, *, count_all: bool = False) -> CheckResult:
    """At least one worker answers a broadcast ping on this deployment's broker.

    Readiness stops at the first answer; `count_all` waits out the timeout to count every
    worker (what `doctor` reports).

    The connection is our own, one attempt bounded by `timeout`, and so is the mailbox (see
    `_ProbeMailbox`), so the check follows the current settings and never hangs on a dead
    broker.
    """
    timeout = timeout if timeout is not None else settings.READINESS_TIMEOUT_SECONDS

    def run() -> dict[str, Any]:
        with Connection(
            settings.CELERY_BROKER_URL,
            connect_timeout=timeout,
            transport_options=dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {})),
        ) as conn:
            conn.ensure_connection(max_retries=0, timeout=timeout)
            replies = (
                _mailbox()(conn)._broadcast(
                    "ping", reply=True, timeout=timeout, limit=None if count_all else 1
                )
                or []
            )
        workers = sorted(name for reply in replies for name in reply)
        if not workers:
            raise CheckFailed(f"no Celery worker answered within {timeout:g}s")
        return {"workers": len(workers)}

    return _timed(run)


#: The checks whose failure makes this process unable to serve, and so fails readiness.
#:
#: - database: nearly every request reads or writes PostgreSQL. Only "unreachable" counts;
#:   a pool busy with other requests does not (`check_database`).
#: - redis: sessions, the cache (gate copies, token grants, throttles), the channel layer
#:   and the broker all live there; without it requests fail or fall back to the database
#:   with no bound. The check uses a connection of its own with a short timeout, never a
#:   connection a request is waiting for.
#:
#: Not counted: celery. No worker answering says nothing about this process: it still serves
#: gate reads, lists and pages, and queues actions on the broker for the workers to run when
#: they are back. Failing readiness for it took every web pod out of the load balancer at
#: once during a worker outage (or under load, a ping answered late), turning "refreshes
#: wait" into "the whole API is down". It is reported under `degraded` for dashboards;
#: `manage.py doctor` counts the workers.
REQUIRED_CHECKS = ("database", "redis")


def readiness_checks() -> dict[str, CheckResult]:
    results = {"database": check_database(), "redis": check_redis()}
    if results["redis"].ok:
        results["celery"] = check_celery()
    else:
        # The broker is that Redis: a ping could only time out, slowly.
        results["celery"] = CheckResult(False, "skipped: the broker (Redis) is unreachable")
    return results


class _ReadinessCache:
    """One check at a time per process; its result serves every probe for a few seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = 0.0
        self._results: dict[str, CheckResult] | None = None

    def get(self) -> dict[str, CheckResult]:
        with self._lock:
            ttl = settings.READINESS_CACHE_SECONDS
            now = time.monotonic()
            if self._results is None or now - self._at >= ttl:
                self._results = readiness_checks()
                self._at = time.monotonic()
            return self._results

    def clear(self) -> None:
        with self._lock:
            self._results = None


readiness_cache = _ReadinessCache()


def readiness_body(results: dict[str, CheckResult]) -> dict[str, Any]:
    failed = [name for name in REQUIRED_CHECKS if name in results and not results[name].ok]
    degraded = [
        name for name, result in results.items() if name not in REQUIRED_CHECKS and not result.ok
    ]
    return {
        "status": "unavailable" if failed else "ok",
        "failed": failed,
        "degraded": degraded,
        "checks": {name: asdict(result) for name, result in results.items()},
    }


def _respond(body: dict[str, Any], status: int) -> HttpResponse:
    response = JsonResponse(body, status=status)
    for name, value in _HEADERS.items():
        response[name] = value
    return response


class HealthCheckMiddleware:
    """Answers the two probe paths before anything else runs (see the module docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path_info
        if path not in (LIVENESS_PATH, READINESS_PATH):
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            response = _respond({"status": "method not allowed"}, 405)
            response["Allow"] = "GET, HEAD"
            return response
        if path == LIVENESS_PATH:
            return _respond({"status": "ok"}, 200)
        body = readiness_body(readiness_cache.get())
        response = _respond(body, 503 if body["failed"] else 200)
        # A failing probe every few seconds is not a server error: the checks log the cause
        # once each, so Django's "Service Unavailable" error line per probe is turned off.
        response._has_been_logged = True  # type: ignore[attr-defined]
        return response
