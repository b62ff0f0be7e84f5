"""Riding out a transient database failure: reconnect, back off, run the work again.

A terminated backend, a failover or a restart surfaces as `OperationalError` or
`InterfaceError` (Django's wrappers of psycopg's, or psycopg's own where Django is bypassed),
and the connection that met it is dead: Django does not reconnect outside a request, so the
same thread would fail at every later statement too. `retry` closes this thread's connections
(the pool discards a broken one), waits with a growing backoff and runs the work again from its
start, until it succeeds or the failures have lasted `REFRESH_DB_OUTAGE_SECONDS`: then it raises
`DatabaseOutage`, whose message names the database, the bound and the last error.

Only whole units of work may be retried: a function that opens its own transaction and
re-checks what it relies on inside it (the executor's fence: `Lease.guard`). Inside an outer
`atomic` block nothing is retried (the outer transaction is lost with the connection; it is the
outer unit that must run again), and any other error propagates at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import psycopg
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections

logger = logging.getLogger(__name__)

#: psycopg's own classes too: Django wraps the errors of its cursors, not those raised where
#: a connection is used directly (COPY through `connection.connection`, the pool's getconn).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
#: First wait after a failure; doubled per failure up to `MAX_BACKOFF_SECONDS`.
FIRST_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 2.0


class DatabaseOutage(Exception):
    """The database stayed unreachable past `REFRESH_DB_OUTAGE_SECONDS`."""

    def __init__(self, what: str, seconds: float, bound: float, error: BaseException) -> None:
        self.what = what
        self.seconds = seconds
        self.bound = bound
        self.error = error
        super().__init__(
            f"database unreachable for {seconds:.1f} s (over REFRESH_DB_OUTAGE_SECONDS="
            f"{bound:g}) while {what}: {type(error).__name__}: {str(error).strip()}"
        )


def is_transient(exc: BaseException) -> bool:
    """A connection-level failure (here or as the cause of a wrapping error). A
    `DatabaseOutage` is not: it is the verdict that retrying has lasted long enough."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None or isinstance(seen, DatabaseOutage):
            return False
        if isinstance(seen, TRANSIENT_ERRORS):
            return True
        seen = seen.__cause__
    return False


def in_transaction() -> bool:
    return any(c.in_atomic_block for c in connections.all(initialized_only=True))


def reconnect() -> None:
    """Drop this thread's connections; the next statement opens a fresh one (from the pool,
    which checks it, where there is one)."""
    for connection in connections.all(initialized_only=True):
        try:
            connection.close()
        except DatabaseError:
            # Defensive: psycopg closes a broken connection quietly and the pool takes one
            # back whatever its state. Should closing fail anyway, forget the connection so
            # the next statement opens a new one.
            connection.connection = None


class Outage:
    """One run of consecutive failures: how long it has lasted, how long to wait next."""

    def __init__(self, bound: float | None = None) -> None:
        self.bound = settings.REFRESH_DB_OUTAGE_SECONDS if bound is None else bound
        self.started: float | None = None
        self.failures = 0

    def failed(self, exc: BaseException, what: str) -> None:
        """Count a failure: raise `DatabaseOutage` past the bound, else reconnect and wait."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
        self.failures += 1
        elapsed = now - self.started
        if elapsed >= self.bound:
            raise DatabaseOutage(what, elapsed, self.bound, exc) from exc
        if self.failures == 1:
            logger.warning("database error while %s; retrying: %s", what, exc)
        reconnect()
        backoff = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** (self.failures - 1))
        time.sleep(max(0.0, min(backoff, self.bound - elapsed)))

    def clear(self) -> None:
        if self.failures:
            logger.info("database answers again after %s failure(s)", self.failures)
        self.started = None
        self.failures = 0


def retry[T](work: Callable[[], T], *, what: str, outage: Outage | None = None) -> T:
    """`work()`, run again from its start after each transient failure (see the module)."""
    outage = outage or Outage()
    while True:
        try:
            result = work()
        except Exception as exc:
            if not is_transient(exc) or in_transaction():
                raise
            outage.failed(exc, what)
            continue
        outage.clear()
        return result
