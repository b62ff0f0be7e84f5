"""`manage.py demo` starts the whole product and stops every child on SIGTERM."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from controlplane.embedded.redis import free_port

ROOT = Path(__file__).resolve().parents[3]


def _processes_with_env(marker: str) -> list[int]:
    """PIDs whose environment carries our unique var dir: the demo's own children."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc to find child processes")
def test_demo_serves_sign_in_and_stops_all_children(tmp_path):
    var_dir = tmp_path / "var"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env["CONTROLPLANE_VAR_DIR"] = str(var_dir)
    output = tmp_path / "demo.out"
    with open(output, "wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", str(port), "--workers", "3"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        text = _wait_for(
            lambda: "Press Ctrl-C" in output.read_text() and output.read_text(),
            timeout=90,
            what="the demo to print its welcome",
        )
        username, password = re.search(r"operator\s+(\S+)\s+(\S+)", text).groups()
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, follow_redirects=False, timeout=10) as client:
            login = client.get("/accounts/login/")
            assert login.status_code == 200
            csrf = client.cookies["csrftoken"]
            signed_in = client.post(
                "/accounts/login/",
                data={"username": username, "password": password, "csrfmiddlewaretoken": csrf},
                headers={"Referer": f"{base}/accounts/login/"},
            )
            assert signed_in.status_code == 302, signed_in.text
            assert client.get("/").status_code == 200
            # Websockets are served by the same uvicorn processes (Channels over ASGI).
            cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
            with ws_connect(
                f"ws://127.0.0.1:{port}/ws/gates/",
                additional_headers={"Cookie": cookie, "Origin": base},
                open_timeout=10,
            ) as ws:
                assert json.loads(ws.recv(timeout=10))
        # redis, fleet, Celery worker and beat, uvicorn's master and its two web processes
        assert len(_processes_with_env(str(var_dir))) >= 7
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)
    assert "Stopped." in output.read_text()
    _wait_for(lambda: not _processes_with_env(str(var_dir)), 15, "children to exit")
