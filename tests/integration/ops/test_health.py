"""/healthz and /readyz: probes answer before host checks, and readiness follows Redis down and
back up with a real Redis server and a real Celery worker on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client

from controlplane.embedded.redis import EmbeddedRedis, free_port, start_embedded_redis
from controlplane.health import readiness_cache

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _fresh_readiness():
    readiness_cache.clear()
    yield
    readiness_cache.clear()


@pytest.fixture
def throwaway_redis(tmp_path) -> Iterator[dict]:
    """A redis-server of our own on a free port, which a test may stop and start again."""
    state: dict = {"port": free_port(), "dir": tmp_path / "redis"}
    state["server"] = start_embedded_redis(state["dir"], port=state["port"])
    state["url"] = f"redis://127.0.0.1:{state['port']}/0"
    yield state
    server: EmbeddedRedis = state["server"]
    server.stop()


def _readyz(client: Client) -> tuple[int, dict]:
    response = client.get("/readyz")
    assert response["Content-Type"] == "application/json"
    assert response["Cache-Control"] == "no-store"
    return response.status_code, response.json()


def _wait_for(client: Client, status: int, timeout: float = 60.0, until=None) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        code, body = _readyz(client)
        if code == status and (until is None or until(body)):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"/readyz stayed {code}: {body}")
        time.sleep(0.2)


def test_healthz_answers_any_host_over_http_without_sign_in(settings):
    settings.ALLOWED_HOSTS = ["controlplane.example"]
    settings.SECURE_SSL_REDIRECT = True
    client = Client()
    response = client.get("/healthz", HTTP_HOST="10.1.2.3:8000")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "default-src 'none'" in response["Content-Security-Policy"]
    # Only the probe paths are exempt: the same request elsewhere meets host validation.
    assert client.get("/", HTTP_HOST="10.1.2.3:8000").status_code == 400


def test_probe_paths_refuse_other_methods():
    response = Client().post("/readyz")
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"


def test_readyz_names_every_failed_dependency(settings, caplog):
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings.REDIS_URL = dead
    settings.CELERY_BROKER_URL = dead
    settings.READINESS_TIMEOUT_SECONDS = 0.5
    code, body = _readyz(Client())
    assert code == 503
    assert body["status"] == "unavailable"
    assert body["failed"] == ["redis"]
    assert body["degraded"] == ["celery"]  # reported, but no reason to take the pod out
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["redis"]["detail"] == "ConnectionError"
    assert "127.0.0.1" not in str(body)  # exception messages (addresses) stay in the logs
    # One warning per failed check, not an error line per probe from Django's request logger.
    assert not [r for r in caplog.records if r.name == "django.request"]


def test_readyz_is_cached_for_a_few_seconds(settings, throwaway_redis):
    settings.REDIS_URL = settings.CELERY_BROKER_URL = throwaway_redis["url"]
    settings.READINESS_TIMEOUT_SECONDS = 0.5
    settings.READINESS_CACHE_SECONDS = 600
    client = Client()
    _, first = _readyz(client)
    assert first["checks"]["redis"]["ok"] is True
    throwaway_redis["server"].stop()
    _, cached = _readyz(client)
    assert cached["checks"]["redis"]["ok"] is True  # the earlier verdict, not a new check
    readiness_cache.clear()
    _, fresh = _readyz(client)
    assert fresh["checks"]["redis"]["ok"] is False


def test_readyz_stays_ready_without_a_celery_worker(settings, throwaway_redis):
    """No worker answering says nothing about this process: it still serves, so the load
    balancer must keep it; the body says what is degraded."""
    settings.REDIS_URL = settings.CELERY_BROKER_URL = throwaway_redis["url"]
    settings.READINESS_TIMEOUT_SECONDS = 0.5
    code, body = _readyz(Client())
    assert code == 200, body
    assert body["status"] == "ok" and body["failed"] == []
    assert body["degraded"] == ["celery"]
    assert body["checks"]["celery"]["detail"] == "no Celery worker answered within 0.5s"


@pytest.fixture
def worker_on(throwaway_redis, settings) -> Iterator[subprocess.Popen]:
    """A real `celery worker` process whose broker is the throwaway Redis."""
    settings.REDIS_URL = settings.CELERY_BROKER_URL = throwaway_redis["url"]
    name = f"readyz-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "REDIS_URL": throwaway_redis["url"], "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "controlplane",
            "worker",
            "--pool",
            "solo",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-Q",
            name,
            "-n",
            f"{name}@%h",
            "-l",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.celery
def test_readyz_fails_while_redis_is_down_and_recovers(settings, throwaway_redis, worker_on):
    settings.READINESS_CACHE_SECONDS = 0
    settings.READINESS_TIMEOUT_SECONDS = 1.0
    client = Client()
    up = _wait_for(client, 200, until=lambda body: body["checks"]["celery"]["ok"])
    assert up["failed"] == [] and up["checks"]["celery"]["extra"]["workers"] == 1

    throwaway_redis["server"].stop()
    code, down = _readyz(client)
    assert code == 503
    assert down["failed"] == ["redis"] and down["degraded"] == ["celery"]

    throwaway_redis["server"] = start_embedded_redis(
        throwaway_redis["dir"], port=throwaway_redis["port"]
    )
    # The worker reconnects to the broker on its own; readiness follows once it answers.
    back = _wait_for(client, 200, until=lambda body: body["checks"]["celery"]["ok"])
    assert back["checks"]["redis"]["ok"] and back["degraded"] == []
