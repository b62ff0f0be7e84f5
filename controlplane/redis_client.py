"""Direct Redis access for the few hot reads kept in memory (gate copies, token grants).

Django's cache pickles its values, and the gate API's hot path (see
`controlplane/intake/api/fast_gate.py`) reads them from a raw ASGI app with redis-py's asyncio
client, so these keys hold plain bytes through a client of their own. Every key starts with
`REDIS_KEY_PREFIX` + "controlplane:", like the Django cache's, so deployments and test runs
sharing one database keep apart and a test run's clean-up removes them.
"""

from __future__ import annotations

import asyncio
import threading
import weakref

import redis
import redis.asyncio
from django.conf import settings

_lock = threading.Lock()
_sync: tuple[str, redis.Redis] | None = None
_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[str, redis.asyncio.Redis]] = (
    weakref.WeakKeyDictionary()
)
#: A Redis that stops answering must not hold a request (or a commit hook) for long: callers
#: treat an error as a miss and go to the database.
SOCKET_TIMEOUT_SECONDS = 2.0
#: Connections per process (and event loop). A request waits for a free one (up to the
#: timeout) rather than failing: redis-py's default pool raises "Too many connections" past
#: 100, which a burst of 256 polls on two processes reaches. A round trip takes well under a
#: millisecond, so a few dozen connections carry thousands of requests a second.
MAX_CONNECTIONS = 48


def key(*parts: str) -> str:
    return ":".join((f"{settings.REDIS_KEY_PREFIX}controlplane", *parts))


def sync_client() -> redis.Redis:
    """One thread-safe client (with its connection pool) per process and REDIS_URL."""
    global _sync
    url = settings.REDIS_URL
    current = _sync
    if current is None or current[0] != url:
        with _lock:
            if _sync is None or _sync[0] != url:
                pool = redis.BlockingConnectionPool.from_url(
                    url,
                    max_connections=MAX_CONNECTIONS,
                    timeout=SOCKET_TIMEOUT_SECONDS,
                    socket_timeout=SOCKET_TIMEOUT_SECONDS,
                    socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
                )
                client = redis.Redis(connection_pool=pool)
                _sync = (url, client)
            current = _sync
    return current[1]


def async_client() -> redis.asyncio.Redis:
    """One client per event loop (an asyncio connection belongs to the loop that opened it)."""
    loop = asyncio.get_running_loop()
    url = settings.REDIS_URL
    current = _async.get(loop)
    if current is None or current[0] != url:
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=SOCKET_TIMEOUT_SECONDS,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
            socket_connect_timeout=SOCKET_TIMEOUT_SECONDS,
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        current = (url, client)
        _async[loop] = current
    return current[1]
