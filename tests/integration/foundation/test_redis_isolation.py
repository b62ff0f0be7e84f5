"""Test runs share a Redis database without touching each other's keys.

Each run has its own key prefix (controlplane/embedded/pytest_plugin.py) for the cache, the
channel layer and the Celery broker, and the per-test clean-up deletes only this run's cache
keys — it used to FLUSHDB, wiping whatever another run on the same machine had in flight.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
import redis
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache

from controlplane.celery import app
from controlplane.embedded.pytest_plugin import RUN_KEY_PREFIX, clear_run_cache

pytestmark = pytest.mark.usefixtures("release_async_resources")

OTHER_RUN = f"cp-test-{uuid.uuid4().hex[:16]}:"


@pytest.fixture(scope="module")
def raw_redis():
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    yield client
    client.close()


@pytest.fixture(scope="module")
def other_runs_keys(raw_redis):
    """Keys another test run (and an unrelated program) hold in the same database. Module
    scope: they are written before the autouse per-test cache clean-up runs."""
    keys = [
        f"{OTHER_RUN}controlplane:1:login-throttle:someone",  # its cache
        f"{OTHER_RUN}asgi:group:fleet",  # its channel layer
        f"{OTHER_RUN}celery",  # its broker queue
        f"not-a-test-run-{uuid.uuid4().hex}",
    ]
    for key in keys:
        raw_redis.set(key, "theirs", ex=600)
    yield keys
    raw_redis.delete(*keys)


def test_the_autouse_clean_up_leaves_other_runs_keys_alone(raw_redis, other_runs_keys):
    assert [raw_redis.get(key) for key in other_runs_keys] == [b"theirs"] * len(other_runs_keys)


def test_clearing_the_cache_deletes_this_runs_keys_only(raw_redis, other_runs_keys):
    cache.set("gate-state", {"open": True})
    assert raw_redis.exists(f"{RUN_KEY_PREFIX}controlplane:1:gate-state")

    assert clear_run_cache() >= 1

    assert cache.get("gate-state") is None
    assert all(raw_redis.exists(key) for key in other_runs_keys)


async def test_cache_channel_layer_and_broker_keys_carry_the_run_prefix(raw_redis):
    assert settings.REDIS_KEY_PREFIX == RUN_KEY_PREFIX == os.environ["REDIS_KEY_PREFIX"]
    group = f"isolation-{uuid.uuid4().hex[:8]}"

    cache.set("probe", 1)
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    queue = f"isolation-{uuid.uuid4().hex[:8]}"
    app.send_task("controlplane.no_such_task", queue=queue)  # only lands in the queue

    try:
        assert raw_redis.exists(f"{RUN_KEY_PREFIX}controlplane:1:probe")
        # Pub/sub channel names are server-wide: the run prefix is what keeps runs apart.
        subscribed = {c.decode() for c in raw_redis.pubsub_channels(f"{RUN_KEY_PREFIX}*")}
        assert any(c.endswith(f"__group__{group}") for c in subscribed), subscribed
        assert raw_redis.llen(f"{RUN_KEY_PREFIX}{queue}") == 1
        assert not raw_redis.exists(queue), "a broker queue outside the run prefix"
    finally:
        await layer.group_discard(group, channel)
        raw_redis.delete(f"{RUN_KEY_PREFIX}{queue}")


def test_every_run_gets_a_prefix_of_its_own():
    """Two runs started from the same environment (even from inside this one, which exported
    its prefix) each pick a fresh prefix."""
    code = "import controlplane.embedded.pytest_plugin as p; print(p.RUN_KEY_PREFIX)"
    prefixes = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(prefixes) == 2 and RUN_KEY_PREFIX not in prefixes, prefixes
    assert all(p.startswith("cp-test-") and p.endswith(":") for p in prefixes), prefixes
