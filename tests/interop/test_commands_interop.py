"""Our management commands against real Dynamo 1.6.1: discovery and policy refresh."""

from __future__ import annotations

import io
import re

import httpx
import pytest
from django.core.management import call_command

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.models import Worker, WorkerState
from tests.interop.conftest import DynamoDeployment, WorkerSpec

pytestmark = [pytest.mark.interop, pytest.mark.django_db(transaction=True)]


def _register(dep: DynamoDeployment, name: str = "real"):
    return services.create_source(
        actor=Actor.system("interop"),
        name=name,
        listener_url=dep.listener_url,
        frontend_url=dep.frontend_url,
        allowed_networks=["127.0.0.0/8"],
    )


def _wire_instance_ids(dep: DynamoDeployment) -> dict[str, int]:
    """component -> instance_id, read as literal digits from the raw listener bytes."""
    raw = httpx.get(f"{dep.listener_url}/v1/rl/workers", timeout=30).text
    return {
        component: int(instance_id)
        for component, instance_id in re.findall(
            r'"component":"([^"]+)","endpoint":"rl","instance_id":(\d+)', raw
        )
    }


def test_discover_lists_real_workers_with_routes_versions_and_errors(
    dynamo_deployment, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "400")  # room for every route name in the ROUTES summary
    dep = dynamo_deployment(
        [
            WorkerSpec("backend", model_name="tiny-policy"),
            WorkerSpec("broken", probe_error="engine is dead"),
        ]
    )
    # A version declared on the real worker, as a trainer's earlier update would leave it.
    declared = httpx.post(
        f"{dep.worker('backend').system_url}/engine/set_weight_version",
        json={"weight_version": "policy-3"},
        timeout=10,
    )
    assert declared.json()["status"] == "ok"
    source = _register(dep)

    out = io.StringIO()
    call_command("discover", source.name, stdout=out)
    table = out.getvalue()

    ids = _wire_instance_ids(dep)
    backend = Worker.objects.get(source=source, component="backend")
    broken = Worker.objects.get(source=source, component="broken")
    # u64 ids survive the database exactly, and the table prints them exactly.
    assert int(backend.instance_id) == ids["backend"]
    assert int(broken.instance_id) == ids["broken"]
    assert backend.key in table and broken.key in table

    assert backend.state == WorkerState.LIVE
    assert backend.family == "vllm"
    assert "update_weights_from_disk" in backend.routes and len(backend.routes) == 12
    assert backend.weight_version == "policy-3"
    backend_line = next(line for line in table.splitlines() if backend.key in line)
    assert "policy-3" in backend_line and "pause_generation" in backend_line
    assert " 12: " in backend_line

    assert broken.state == WorkerState.ERRORING
    broken_line = next(line for line in table.splitlines() if broken.key in line)
    assert "engine is dead" in broken_line


def test_discover_fails_with_one_line_reason_when_listener_is_gone(dynamo_deployment):
    dep = dynamo_deployment([WorkerSpec("backend")])
    source = _register(dep)
    call_command("discover", source.name, stdout=io.StringIO())
    dep.frontend.stop()

    from django.core.management.base import CommandError

    with pytest.raises(CommandError) as failure:
        call_command("discover", source.name, stdout=io.StringIO())
    assert "\n" not in str(failure.value)
    assert "unreachable" in str(failure.value)
    source.refresh_from_db()
    assert source.stale
    # The last known worker stays visible instead of vanishing with the listener.
    assert Worker.objects.filter(source=source).exclude(state=WorkerState.GONE).count() == 1
