"""The web pool's reconnection backoff is capped (`controlplane.dbpool`): after a failover it
tries again within a second, where psycopg_pool alone waits 1, 2, 4, 8 … seconds."""

from __future__ import annotations

import threading
import time

import psycopg
import psycopg_pool.pool
import pytest
from psycopg_pool import ConnectionPool

from controlplane import dbpool


@pytest.fixture
def capped(monkeypatch):
    monkeypatch.setattr(
        psycopg_pool.pool, "AttemptWithBackoff", psycopg_pool.pool.AttemptWithBackoff
    )
    dbpool.cap_reconnect_backoff()
    assert psycopg_pool.pool.AttemptWithBackoff is dbpool.PromptReconnect


def test_the_delays_start_small_and_never_pass_the_cap(capped):
    attempt = dbpool.PromptReconnect(timeout=300)
    delays = []
    for _ in range(8):
        attempt.update_delay(time.monotonic())
        delays.append(attempt.delay)
    assert delays[0] <= 0.11
    assert max(delays) == dbpool.RECONNECT_MAX_DELAY_SECONDS
    assert delays == sorted(delays)


def test_a_pool_whose_server_is_down_tries_again_every_second_at_most(capped):
    """A pool that cannot connect keeps trying often: five attempts within three seconds
    (psycopg_pool's own backoff makes three: at 0, 1 and 3 s)."""
    attempts = []
    enough = threading.Event()

    pool = ConnectionPool("host=127.0.0.1 port=9", min_size=1, open=False, name="down")

    def refused(*args, **kwargs):
        attempts.append(time.monotonic())
        if len(attempts) >= 5:
            enough.set()
        raise psycopg.OperationalError("connection refused")

    pool._connect = refused
    pool.open(wait=False)
    try:
        assert enough.wait(3.0), f"{len(attempts)} attempts in 3 s"
    finally:
        pool.close(timeout=1)
