"""The harness itself, checked with plain httpx (independent of controlplane.dynamo)."""

from __future__ import annotations

import httpx
import pytest

from tests.interop.conftest import WorkerSpec

pytestmark = pytest.mark.interop


def test_listener_lists_real_workers_and_system_server_answers(dynamo_deployment):
    dep = dynamo_deployment(
        [
            WorkerSpec("backend"),
            WorkerSpec("broken", probe_error="engine is dead"),
        ]
    )
    listing = dep.listing()
    assert listing["protocol_version"] == 1
    assert listing["namespace"] == "dynamo"
    by_component = {w["component"]: w for w in listing["workers"]}
    assert set(by_component) == {"backend", "broken"}

    good = by_component["backend"]
    assert good["system_url"] == dep.worker("backend").system_url
    assert good["request_plane_url"] == "dyn://dynamo.backend.rl"
    assert good["world_size"] == 1
    assert "pause_generation" in good["routes"]
    # Any method reaches the handler; the body is JSON labelled text/plain.
    reply = httpx.post(f"{good['system_url']}/engine/get_weight_version", json={}, timeout=10)
    assert reply.status_code == 200
    assert reply.json() == {"status": "ok", "version": None, "version_declared": False}

    bad = by_component["broken"]
    assert bad["error"] == "engine is dead"
    assert bad["routes"] == []
    assert "system_url" not in bad and "world_size" not in bad
