"""The web server holds at most its pool's PostgreSQL connections, however many requests come.

Under Daphne each request's sync code runs in a thread of its own; with persistent connections
(CONN_MAX_AGE) every such thread kept one, and a burst of concurrent requests exhausted the
server's 100 connections. A burst at the real ASGI server (its own process, real PostgreSQL)
must leave no 5xx and never more connections than the pool's maximum, sampled from
pg_stat_activity while the burst runs and after it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import httpx
import psycopg
import pytest
from django.conf import settings
from django.db import connections
from django.test import Client

from tests.fixtures.live_server import LIVE_SERVER_APPLICATION_NAME

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
        reason="connection pooling is PostgreSQL's; SQLite has no server connections to count",
    ),
]

REQUESTS = 1_000
CONCURRENCY = 100
#: An authenticated API read: session, user and a query of its own, all in the database.
PATH = "/api/v1/sources"


class ConnectionSampler:
    """Counts the live server's connections to the test database, over and over, in a thread
    with its own (separately named) connection."""

    QUERY = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = %s"
    )

    def __init__(self) -> None:
        db = connections["default"].settings_dict
        self._conninfo = {
            "host": db.get("HOST") or "127.0.0.1",
            "port": db.get("PORT") or 5432,
            "user": db.get("USER") or None,
            "password": db.get("PASSWORD") or None,
            "dbname": db["NAME"],
            "application_name": "cp-test-connection-sampler",
            "autocommit": True,
        }
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int:
        with psycopg.connect(**self._conninfo) as conn:
            return conn.execute(self.QUERY, (LIVE_SERVER_APPLICATION_NAME,)).fetchone()[0]

    def _run(self) -> None:
        with psycopg.connect(**self._conninfo) as conn:
            while not self._stop.is_set():
                row = conn.execute(self.QUERY, (LIVE_SERVER_APPLICATION_NAME,)).fetchone()
                self.samples.append(row[0])
                self._stop.wait(0.01)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def viewer_cookies(viewer) -> dict[str, str]:
    client = Client()
    client.force_login(viewer)
    name = settings.SESSION_COOKIE_NAME
    return {name: client.cookies[name].value}


async def _burst(base_url: str, cookies: dict[str, str]) -> Counter:
    statuses: Counter = Counter()
    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)

    async with httpx.AsyncClient(
        base_url=base_url, cookies=cookies, limits=limits, timeout=60
    ) as client:

        async def one() -> None:
            async with gate:
                try:
                    response = await client.get(PATH)
                    statuses[response.status_code] += 1
                except httpx.TransportError as exc:
                    statuses[type(exc).__name__] += 1

        await asyncio.gather(*(one() for _ in range(REQUESTS)))
    return statuses


async def test_a_burst_of_requests_stays_within_the_pool(live_server_url, viewer_cookies):
    pool_max = settings.DATABASE_POOL_MAX_SIZE
    sampler = ConnectionSampler()
    started = time.monotonic()
    with sampler:
        statuses = await _burst(live_server_url, viewer_cookies)
    elapsed = time.monotonic() - started
    after = await asyncio.to_thread(sampler.count)

    during = sampler.samples
    print(
        f"\n{REQUESTS} GET {PATH} at concurrency {CONCURRENCY} in {elapsed:.1f} s: "
        f"statuses {dict(statuses)}; server connections: peak {max(during)} "
        f"over {len(during)} samples, {after} after; pool max {pool_max}"
    )
    server_errors = sum(n for s, n in statuses.items() if not isinstance(s, int) or s >= 500)
    assert server_errors == 0, statuses
    assert statuses == {200: REQUESTS}, statuses  # authenticated, and every one answered
    assert len(during) >= 10, "the burst ended before it could be sampled"
    assert max(during) <= pool_max
    assert after <= pool_max
