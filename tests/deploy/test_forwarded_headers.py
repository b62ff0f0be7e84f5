"""The shipped web commands (Dockerfile, docker-compose.yml, Kubernetes), run as shipped: a
forged `X-Forwarded-For` from a peer that is not the configured proxy does not make a client
local, so it cannot reach /metrics; from the proxy the header is honoured."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from controlplane.embedded.redis import free_port
from deploy import validate
from tests.fixtures.live_server import _database_url

ROOT = validate.ROOT
#: Somewhere the test client never is: the "proxy" when the test plays an outside client.
ELSEWHERE = "192.0.2.254"
#: The only address /metrics is served to in these tests (never the test's own loopback).
SCRAPER = "192.0.2.1"


def dockerfile_command() -> str:
    cmd = next(
        line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")
    )
    argv = json.loads(cmd.removeprefix("CMD "))
    assert argv[:2] == ["sh", "-c"], argv
    return argv[2]


def compose_command() -> str:
    argv = validate.load_compose()["services"]["web"]["command"]
    assert argv[:2] == ["sh", "-c"], argv
    return argv[2]


def kubernetes_command() -> str:
    docs = yaml.safe_load_all((ROOT / "deploy/kubernetes/base/web.yaml").read_text())
    web = next(d for d in docs if d and d["kind"] == "Deployment")
    argv = web["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[:2] == ["sh", "-c"], argv
    return argv[2]


SHIPPED = {"Dockerfile": dockerfile_command, "compose": compose_command, "k8s": kubernetes_command}


def _local(command: str, port: int) -> str:
    """The shipped shell command on this machine's loopback, this venv's uvicorn, one process."""
    command, bound = re.subn(
        r"--host 0\.0\.0\.0 --port 8000", f"--host 127.0.0.1 --port {port}", command
    )
    assert bound == 1, command
    return command.replace("exec uvicorn ", f"exec {sys.executable} -m uvicorn ", 1)


@contextmanager
def shipped_server(command: str, tmp_path: Path, **env: str) -> Iterator[str]:
    port = free_port()
    environ = dict(os.environ, DATABASE_URL=_database_url(), WEB_CONCURRENCY="1", **env)
    environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    environ.pop("TRUSTED_PROXIES", None)
    log = tmp_path / "web.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["sh", "-c", _local(command, port)], cwd=ROOT, env=environ, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.mark.parametrize("shipped", SHIPPED, ids=list(SHIPPED))
def test_a_forged_forwarded_for_does_not_reach_metrics(shipped, tmp_path, transactional_db):
    command = SHIPPED[shipped]()
    env = {"FORWARDED_ALLOW_IPS": ELSEWHERE, "METRICS_ALLOWED_NETWORKS": f"{SCRAPER}/32"}
    with shipped_server(command, tmp_path, **env) as url:
        forged = httpx.get(f"{url}/metrics", headers={"X-Forwarded-For": SCRAPER}, timeout=10)
    assert forged.status_code == 403, forged.text[:300]


def test_the_configured_proxy_is_believed(tmp_path, transactional_db):
    env = {"FORWARDED_ALLOW_IPS": "127.0.0.1", "METRICS_ALLOWED_NETWORKS": f"{SCRAPER}/32"}
    with shipped_server(dockerfile_command(), tmp_path, **env) as url:
        via_proxy = httpx.get(f"{url}/metrics", headers={"X-Forwarded-For": SCRAPER}, timeout=10)
        proxy_itself = httpx.get(f"{url}/metrics", timeout=10)
    assert via_proxy.status_code == 200, via_proxy.text[:300]
    assert "controlplane_workers" in via_proxy.text
    assert proxy_itself.status_code == 403
