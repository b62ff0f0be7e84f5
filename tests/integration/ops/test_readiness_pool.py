"""/readyz and the connection pool: a pool lent out to requests is "busy", not a failure; a
database that cannot be reached still fails readiness."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from psycopg_pool import ConnectionPool, PoolTimeout

from controlplane import health
from controlplane.embedded.redis import free_port
from tests.postgres import postgres_only

pytestmark = pytest.mark.django_db


def check_in_a_request_thread() -> tuple[health.CheckResult, float]:
    """The database check as a probe runs it: in a thread of its own, with no connection."""
    found: list = []

    def run() -> None:
        started = time.monotonic()
        try:
            found.append((health.check_database(), time.monotonic() - started))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert found, "the check did not end"
    return found[0]


@postgres_only
def test_a_pool_lent_out_to_requests_is_busy_not_unready(settings):
    settings.READINESS_TIMEOUT_SECONDS = 2.0
    pool = connection.pool
    assert pool is not None, "web processes use a pool (CONTROLPLANE_PROCESS=web)"
    held = []
    try:
        while True:  # what long requests do: every connection of the pool taken
            try:
                held.append(pool.getconn(timeout=1.0))
            except PoolTimeout:
                break
        assert pool.get_stats()["pool_available"] == 0
        result, seconds = check_in_a_request_thread()
    finally:
        for conn in held:
            pool.putconn(conn)
    assert result.ok, result
    assert result.extra["pool"] == "busy"
    # It did not wait for the pool's own timeout (DATABASE_POOL_TIMEOUT_SECONDS).
    assert seconds < health.POOL_WAIT_SECONDS + 2.0, seconds
    # With the pool free again it takes a pooled connection and says nothing more.
    again, _ = check_in_a_request_thread()
    assert again.ok and again.extra == {}


def test_an_unreachable_database_still_fails_readiness(monkeypatch, settings):
    settings.READINESS_TIMEOUT_SECONDS = 1.0
    dead = ConnectionPool(
        f"host=127.0.0.1 port={free_port()} dbname=nothing connect_timeout=2",
        min_size=0,
        max_size=2,
        open=True,
    )

    class Nowhere:
        pool = dead

    monkeypatch.setattr(health, "connection", Nowhere())
    try:
        result = health.check_database()
    finally:
        dead.close()
    assert not result.ok
    assert result.detail == "OperationalError"
