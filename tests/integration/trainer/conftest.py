"""The live stack the trainer library is driven against: the web server and a Celery worker,
each in its own process as production runs them, on the test database and the machine's Redis.

Both get a Redis key prefix of their own (under this run's), so the web server's enqueued
tasks reach exactly this worker and no other test's. The module's tests share them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.fixtures.live_server import ROOT, _database_url, asgi_server


@pytest.fixture(scope="module")
def trainer_stack_url(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """The web server's URL; webhooks it accepts are processed by the worker beside it."""
    logs = tmp_path_factory.mktemp("trainer-stack")
    prefix = f"{os.environ.get('REDIS_KEY_PREFIX', '')}trainer-{uuid.uuid4().hex[:8]}:"
    env = dict(
        os.environ,
        DATABASE_URL=_database_url(),
        CONTROLPLANE_PROCESS="celery",
        REDIS_KEY_PREFIX=prefix,
    )
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    worker_log = logs / "celery.log"
    command = [
        sys.executable,
        *("-m", "celery", "-A", "controlplane", "worker", "-P", "threads", "-c", "4"),
        *("-l", "INFO", "--without-mingle", "--without-gossip"),
    ]
    with open(worker_log, "wb") as log:
        worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while b"ready." not in worker_log.read_bytes():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Celery worker did not start:\n{worker_log.read_text()}")
            time.sleep(0.2)
        with asgi_server(logs / "web.log", REDIS_KEY_PREFIX=prefix) as url:
            yield url
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
