"""The check the web process's connection pool runs on each connection before handing it out.

`psycopg_pool.ConnectionPool.check_connection` alone discards a dead connection and tries the
next, but backs off between failed checks (1 s, 2 s, 4 s, …): after a restart or a failover
every idle connection in the pool is dead, and a request met the pool's timeout (a 500) before
the checks reached a live one. So a failed check checks every idle connection at once
(`ConnectionPool.check`: one empty statement each, the broken replaced in the background), and
the request waits for one backoff step, not for the pool to find out one connection at a time.

The pool also waits too long to reconnect. When opening a connection fails (the server
restarting, or a backend terminated while it authenticates), psycopg_pool tries again after
1 s, then 2, 4, 8 … up to its `reconnect_timeout` (5 minutes), and only one attempt to grow the
pool runs at a time. So a pool whose connections all died during a failover could keep every
request waiting for its whole timeout (a 500) long after the server answered again: measured
in `tests/fault/test_postgres_backends_terminated.py`, whose terminations left a pool idle for
over 10 s while the database was up. `cap_reconnect_backoff` keeps the first retry at 0.1 s
and never waits more than `RECONNECT_MAX_DELAY_SECONDS` between tries: at most one connection
attempt a second per process against a server that is down, and the first request after it
returns waits about a second at most.
"""

from __future__ import annotations

from typing import Any

import psycopg_pool.pool
from psycopg_pool import ConnectionPool
from psycopg_pool.base import AttemptWithBackoff

#: The longest wait between two attempts to open a pool connection (see the module).
RECONNECT_MAX_DELAY_SECONDS = 1.0


class PromptReconnect(AttemptWithBackoff):
    """psycopg_pool's reconnection backoff, starting at 0.1 s and capped (see the module)."""

    INITIAL_DELAY = 0.1

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_MAX_DELAY_SECONDS)


def cap_reconnect_backoff() -> None:
    """Make the pools of this process reconnect with `PromptReconnect`.

    psycopg_pool builds each reconnection's backoff from its module's `AttemptWithBackoff`
    (3.2 and 3.3 alike); it offers no option for the delays. Refuses to start on a version
    that builds it some other way, rather than lose the cap without a word."""
    if not issubclass(PromptReconnect, psycopg_pool.pool.AttemptWithBackoff):
        raise RuntimeError("psycopg_pool no longer builds its reconnection backoff here")
    psycopg_pool.pool.AttemptWithBackoff = PromptReconnect  # type: ignore[misc]


def check_connection(conn: Any) -> None:
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        # The pool marks each connection it hands out with itself (psycopg's `_pool`) before
        # running the check.
        pool = getattr(conn, "_pool", None)
        if isinstance(pool, ConnectionPool):
            pool.check()
        raise
