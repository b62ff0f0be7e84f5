"""Drift against real Dynamo 1.6.1: a worker process restarted after a refresh to V comes back
with a new instance id on its old (undeclared) weights; the next discovery quarantines it,
catches it up alone to V on the real system server and admits it back into the gate's verified
set. Discovery, drift reconciliation and catch-up run through the real Celery worker.
"""

from __future__ import annotations

import io

import httpx
import pytest
from django.core.management import call_command

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.audit.recorder import Actor
from controlplane.fleet import discovery, services
from controlplane.fleet.models import DiscoveryTrigger
from controlplane.refresh.models import (
    Gate,
    GateState,
    Quarantine,
    QuarantineCall,
    QuarantineState,
)
from tests.integration.refresh.helpers import wait_for
from tests.interop.conftest import WorkerSpec

pytestmark = [pytest.mark.interop, pytest.mark.django_db(transaction=True)]

VERSION = "policy-9"
MODEL_PATH = "/ckpt/9"


def _engine(url: str, route: str) -> dict:
    response = httpx.post(f"{url}/engine/{route}", json={}, timeout=10)
    response.raise_for_status()
    return response.json()


def _instance_ids(dep) -> set[str]:
    return {
        str(e["instance_id"])
        for e in dep.listing().get("workers", [])
        if e.get("system_url") and e.get("status") != "error"
    }


def test_restarted_worker_is_detected_and_caught_up(dynamo_deployment, celery_worker):
    dep = dynamo_deployment(
        [WorkerSpec("backend", namespace="rl-a", model_name="tiny-a")],
        frontend_env={"DYN_NAMESPACE_PREFIX": "rl"},
    )
    source = services.create_source(
        actor=Actor.system("interop"),
        name="real",
        listener_url=dep.listener_url,
        frontend_url=dep.frontend_url,
        allowed_networks=["127.0.0.0/8"],
    )
    create_user_with_role("interop-operator", Role.OPERATOR, "interop-pass-1234", validate=False)
    out = io.StringIO()
    call_command(
        "policy_refresh",
        source.name,
        "--as",
        "interop-operator",
        "--weight-version",
        VERSION,
        "--model-path",
        MODEL_PATH,
        "--namespace",
        "rl-a",
        "--yes",
        stdout=out,
        stderr=io.StringIO(),
    )
    gate = Gate.objects.get(source=source, namespace="rl-a")
    assert gate.state == GateState.OPEN, out.getvalue()
    (old_id,) = gate.verified_instances

    worker = dep.workers[0]
    worker.restart()
    new_ids = wait_for(lambda: _instance_ids(dep) - {old_id}, timeout=90)
    (new_id,) = new_ids
    assert _engine(worker.system_url, "get_weight_version")["version_declared"] is False

    discovery.run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=30)
    q = wait_for(
        lambda: Quarantine.objects.filter(
            instance_id=new_id, state=QuarantineState.ADMITTED
        ).first(),
        timeout=120,
    )
    assert q.kind == "joined"
    steps = [s for (s,) in QuarantineCall.objects.filter(quarantine=q).values_list("step")]
    assert steps[0] == "pause" and "update" in steps and "resume_engines" in steps
    assert all(QuarantineCall.objects.filter(quarantine=q).values_list("ok", flat=True))
    assert _engine(worker.system_url, "get_weight_version") == {
        "status": "ok",
        "version": VERSION,
        "version_declared": True,
    }
    assert _engine(worker.system_url, "interop/state")["paused"] is False
    gate.refresh_from_db()
    assert gate.state == GateState.OPEN
    assert gate.verified_instances == [new_id] and gate.drift == []
