"""`manage.py demo` starts the whole product, says what it is doing while it starts, and stops
every child on SIGTERM."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from controlplane.embedded.redis import free_port

ROOT = Path(__file__).resolve().parents[3]

# The start-up stages, in the order the demo announces them (each line before the stage runs).
STAGES = [
    "Starting embedded Redis",
    "Migrating the database",
    "Creating demo users",
    "Starting the simulated fleet (3 workers)",
    "Starting the Celery worker",
    "Starting Celery beat",
    "Starting the web server on http://127.0.0.1:{port}/ (2 processes)",
    "Waiting for the first discovery of the simulated fleet",
    "First discovery finished (ok)",
    "Ready in",
]
STAGE_LINE = re.compile(r"^\[\s*(\d+\.\d) s\] (.*)$", re.MULTILINE)


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


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _sign_in(client: httpx.Client, base: str, username: str, password: str) -> None:
    client.get("/accounts/login/")
    response = client.post(
        "/accounts/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": f"{base}/accounts/login/"},
    )
    assert response.status_code == 302, response.text


def _option_value(html: str, label: str) -> str:
    return re.search(rf'<option value="(\d+)"[^>]*>{re.escape(label)}</option>', html).group(1)


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
        # Each stage line is flushed as the stage begins: by the time the web server answers,
        # its line is in the file (block-buffered output would still hold all of them).
        _wait_for(
            lambda: _answers(f"http://127.0.0.1:{port}/accounts/login/"),
            timeout=90,
            what="the web server to answer",
        )
        assert f"Starting the web server on http://127.0.0.1:{port}/" in output.read_text()
        text = _wait_for(
            lambda: "Press Ctrl-C" in output.read_text() and output.read_text(),
            timeout=90,
            what="the demo to print its welcome",
        )
        stages = STAGE_LINE.findall(text.split("is running at")[0])
        expected = [s.format(port=port) for s in STAGES]
        assert [t for _, t in stages if not any(t.startswith(e) for e in expected)] == []
        assert [next(e for e in expected if t.startswith(e)) for _, t in stages] == expected
        seconds = [float(s) for s, _ in stages]
        assert seconds == sorted(seconds)
        # Every URL the demo prints on this host is on the chosen port (the simulated fleet's
        # own URLs are on theirs, named as such).
        web_urls = re.findall(r"http://127\.0\.0\.1:(\d+)/", text.split("Simulated fleet")[0])
        web_urls += re.findall(r"http://127\.0\.0\.1:(\d+)/", text.split("Trainer webhooks")[1])
        assert web_urls and set(web_urls) == {str(port)}
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
            # The demo's 404 is the product's page, not Django's DEBUG list of URL patterns.
            missing = client.get("/no-such-page/")
            assert missing.status_code == 404 and 'id="error-404"' in missing.text
            assert "URLconf" not in missing.text and "admin-tools/" not in missing.text
            # Websockets are served by the same uvicorn processes (Channels over ASGI).
            cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
            with ws_connect(
                f"ws://127.0.0.1:{port}/ws/gates/",
                additional_headers={"Cookie": cookie, "Origin": base},
                open_timeout=10,
            ) as ws:
                assert json.loads(ws.recv(timeout=10))
        # The trainer webhook URL shown to admins carries the demo's port too.
        admin_user, admin_password = re.search(
            r"^\s+admin\s+(\S+)\s+(\S+)", text, re.MULTILINE
        ).groups()
        with httpx.Client(base_url=base, follow_redirects=False, timeout=10) as admin:
            _sign_in(admin, base, admin_user, admin_password)
            created = admin.post(
                "/admin-tools/webhooks/new/",
                data={
                    "name": "trainer-a",
                    "source": _option_value(admin.get("/admin-tools/webhooks/new/").text, "sim"),
                    "policy": "require_approval",
                    "pause_mode": "auto",
                    "enabled": "on",
                    "csrfmiddlewaretoken": admin.cookies["csrftoken"],
                },
                headers={"Referer": f"{base}/admin-tools/webhooks/new/"},
            )
            assert created.status_code == 302, created.text  # to the secret, shown once
            shown = admin.get(created.headers["Location"])
            assert f"{base}/api/v1/webhooks/trainer/trainer-a" in shown.text
        # redis, fleet, Celery worker and beat, uvicorn's master and its two web processes
        assert len(_processes_with_env(str(var_dir))) >= 7
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)
    assert "Stopped." in output.read_text()
    _wait_for(lambda: not _processes_with_env(str(var_dir)), 15, "children to exit")


def _second_shell_env(var_dir: Path) -> dict[str, str]:
    """A terminal beside the demo: the same checkout and var dir, no REDIS_URL or DATABASE_URL
    (the test run's REDIS_KEY_PREFIX stays: the demo inherited it as well)."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env["CONTROLPLANE_VAR_DIR"] = str(var_dir)
    return env


def _manage(var_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=_second_shell_env(var_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc to find child processes")
def test_a_second_shell_uses_the_demos_runtime(tmp_path):
    """`refresh plan` and `refresh start` in another terminal, with no extra environment, reach
    the demo's Redis: the demo's executor picks the refresh up within 2 s of its start (on
    127.0.0.1:6379 nobody would, until the reconciler's tick 15 s later)."""
    var_dir = tmp_path / "var"
    port = free_port()
    output = tmp_path / "demo.out"
    with open(output, "wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", str(port), "--workers", "3"],
            cwd=ROOT,
            env=_second_shell_env(var_dir),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    runtime_file = var_dir / "demo-runtime.json"
    try:
        text = _wait_for(
            lambda: "Press Ctrl-C" in output.read_text() and output.read_text(),
            timeout=120,
            what="the demo to print its welcome",
        )
        assert str(runtime_file) in text
        written = json.loads(runtime_file.read_text())
        assert written["pid"] == demo.pid and written["redis_url"] != "redis://127.0.0.1:6379/0"
        operator = re.search(r"^\s+operator\s+(\S+)\s+\S+", text, re.MULTILINE).group(1)

        planned = _manage(
            var_dir,
            "refresh",
            "plan",
            "sim",
            "--weight-version",
            "step-2",
            "--model-path",
            "/ckpt/step-2",
            "--as",
            operator,
            "--json",
        )
        assert planned.returncode == 0, planned.stdout + planned.stderr
        assert "running demo" not in planned.stderr  # same runtime: no notice
        refresh_id = json.loads(planned.stdout)["refresh"]["id"]

        watching = subprocess.Popen(
            [
                *(sys.executable, "manage.py", "refresh", "start", str(refresh_id)),
                *("--as", operator, "--json", "--watch", "--interval", "0.1", "--timeout", "60"),
            ],
            cwd=ROOT,
            env=_second_shell_env(var_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            started_at = executing_at = None
            for line in watching.stdout:
                document = json.loads(line)
                if document.get("action") == "start":
                    started_at = time.monotonic()
                    assert document["refresh"]["state"] in {"gating", "awaiting_approval"}
                    continue
                if any(s["status"] != "pending" for s in document["steps"]):
                    executing_at = time.monotonic()
                    break
            assert started_at is not None, watching.stderr.read()
            assert executing_at is not None, "the refresh never began executing"
            assert executing_at - started_at <= 2.0, executing_at - started_at
        finally:
            watching.kill()
            watching.wait(timeout=10)

        # What the web server sees is the same refresh, in the same database.
        base = f"http://127.0.0.1:{port}"
        username, password = re.search(r"^\s+viewer\s+(\S+)\s+(\S+)", text, re.MULTILINE).groups()
        with httpx.Client(base_url=base, follow_redirects=False, timeout=10) as client:
            _sign_in(client, base, username, password)
            assert client.get(f"/refreshes/{refresh_id}/").status_code == 200

        # A shell told to use another Redis says so, once, on stderr.
        elsewhere = _manage(var_dir, "refresh", "list", "--json")
        assert "running demo" not in elsewhere.stderr
        told = subprocess.run(
            [sys.executable, "manage.py", "refresh", "list", "--json"],
            cwd=ROOT,
            env=_second_shell_env(var_dir) | {"REDIS_URL": "redis://127.0.0.1:1/0"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert told.returncode == 0, told.stderr
        assert told.stderr.count("Not the running demo's runtime") == 1
        assert json.loads(told.stdout)["ok"] is True
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)
    assert not runtime_file.exists()


@pytest.mark.django_db
def test_the_simulated_fleet_moves_to_free_ports_when_its_usual_one_is_taken_meanwhile(
    tmp_path, monkeypatch
):
    """Two demos starting at once both find the usual ports free, and only one fleet can bind
    them: the other fleet exits, and starts again on ports the system picks. (It used to take
    the whole demo down: "simfleet did not report …".)"""
    from urllib.parse import urlsplit

    from controlplane.embedded.management.commands import demo
    from controlplane.embedded.supervisor import Supervisor

    with socket.socket() as taken:  # the other demo's fleet, bound after our check
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        monkeypatch.setattr(demo, "SIM_PORTS", (free_port(), held, free_port()))
        monkeypatch.setattr(demo, "_port_is_free", lambda port: True)
        supervisor = Supervisor(tmp_path / "logs")
        command = demo.Command()
        try:
            command._start_simfleet(supervisor, workers=2, namespaces="rl-a")
            assert len(supervisor.children) == 1 and supervisor.children[0].alive()
            assert supervisor.first_exited() is None
            listener = urlsplit(command.sim_urls["listener_url"])
            assert listener.port not in (held, None)
            assert httpx.get(f"{command.sim_urls['listener_url']}/", timeout=5).status_code < 500
        finally:
            supervisor.stop_all()
    assert "in use" in (tmp_path / "logs" / "simfleet.log").read_text().lower()
