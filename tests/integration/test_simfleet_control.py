"""The `/_sim/` control API over HTTP, churn, scale (2,000 workers) and the standalone runner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from controlplane.dynamo.discovery import parse_discovery
from controlplane.simfleet import Fault, FleetConfig, SimFleetControl, SimFleetError

REPO = Path(__file__).resolve().parents[2]


def test_control_client_mirrors_handle(simfleet):
    with SimFleetControl(simfleet.control_url) as control:
        assert control.fleet()["listener_url"] == simfleet.listener_url
        assert len(control.workers()) == 4
        key = control.add_worker({"namespace": "rl-c", "family": "vllm-sidecar"})
        control.inject(key, "control/get_weight_version", Fault.http(502, once=True))
        url = control.state(key)["system_url"]
        assert httpx.post(f"{url}/engine/control/get_weight_version").status_code == 502
        control.set_version(key, "v3")
        assert httpx.post(f"{url}/engine/control/get_weight_version").json() == {
            "weight_version": "v3"
        }
        state = control.state(key)
        assert state["version"] == "v3" and state["calls"][-1]["status"] == 200
        control.inject(key, "probe", {"kind": "probe_error", "message": "boom"})
        assert state["instance_id"] == simfleet.state(key)["instance_id"]
        control.clear_faults()
        assert control.state(key)["faults"] == {}
        control.remove_worker(key)
        assert [e["event"] for e in control.events()][-2:] == ["join", "leave"]
        with pytest.raises(SimFleetError):
            control.state(key)
        with pytest.raises(SimFleetError):
            control.inject(simfleet.workers()[0]["key"], "probe", {"kind": "nonsense"})


def test_automatic_churn(simfleet):
    before = {w["key"] for w in simfleet.workers()}
    SimFleetControl(simfleet.control_url).set_churn(0.05)
    time.sleep(0.5)
    simfleet.set_churn(None)
    events = simfleet.events()
    assert sum(1 for e in events if e["event"] in ("join", "leave")) > 4
    assert {w["key"] for w in simfleet.workers()} != before
    assert 2 <= len(simfleet.workers()) <= 6


def test_two_thousand_workers(simfleet_factory):
    fleet = simfleet_factory(
        FleetConfig.generate(workers=2000, namespaces=["rl-a", "rl-b", "rl-c"], prefix="rl")
    )
    started = time.monotonic()
    response = httpx.get(f"{fleet.listener_url}/v1/rl/workers", timeout=30)
    elapsed = time.monotonic() - started
    result = parse_discovery(response.content)
    assert len(result.workers) == 2000 and result.rejected == ()
    assert elapsed < 5, f"listing 2,000 workers took {elapsed:.2f}s"
    urls = [w.system_url for w in result.workers[::200]]
    with httpx.Client() as client:
        for url in urls:
            assert client.post(f"{url}/engine/liveness_probe").json()["alive"] is True


@pytest.mark.parametrize(
    "entry", [["-m", "controlplane.simfleet"], ["manage.py", "simfleet"]], ids=["module", "manage"]
)
def test_standalone_runner_serves_the_listener(entry):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, *entry, "--workers", "6", "--prefix", "rl"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        urls = {}
        while len(urls) < 4:
            line = process.stdout.readline()
            assert line, "runner exited before printing its URLs"
            name, _, value = line.strip().partition("=")
            if name.endswith("_url"):
                urls[name] = value
        payload = httpx.get(f"{urls['listener_url']}/v1/rl/workers").json()
        assert payload["namespace"] == "rl" and len(payload["workers"]) == 6
        assert {w["namespace"] for w in payload["workers"]} == {"rl-a", "rl-b"}
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0


def test_the_control_url_answers_its_route_table(simfleet):
    """The demo prints the control URL: a GET on it says what it offers (it answered 404)."""
    answer = httpx.get(simfleet.control_url, timeout=10)
    assert answer.status_code == 200
    body = answer.json()
    routes = {(r["method"], r["path"]) for r in body["routes"]}
    assert ("POST", "/_sim/workers/<key>/faults") in routes
    assert ("DELETE", "/_sim/faults") in routes
    assert "hang" in body["fault_kinds"] and body["listener_url"] == simfleet.listener_url
