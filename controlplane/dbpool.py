"""The check the web process's connection pool runs on each connection before handing it out.

`psycopg_pool.ConnectionPool.check_connection` alone discards a dead connection and tries the
next, but backs off between failed checks (1 s, 2 s, 4 s, …): after a restart or a failover
every idle connection in the pool is dead, and a request met the pool's timeout (a 500) before
the checks reached a live one. So a failed check checks every idle connection at once
(`ConnectionPool.check`: one empty statement each, the broken replaced in the background), and
the request waits for one backoff step, not for the pool to find out one connection at a time.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import ConnectionPool


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
