"""The serving ledger against real Dynamo 1.6.1: after a refresh, a worker restart and its
quarantine catch-up, and a force-reopen of a held refresh, the ledger's current intervals name
the version each real worker reads back (`get_weight_version` on its own system server), and
the provenance API answers those versions for those instances now. Discovery, drift and the
catch-up run through the real Celery worker.
"""

from __future__ import annotations

import httpx
import pytest
from django.utils import timezone

from controlplane.refresh import intents, ledger
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    Admission,
    Evidence,
    Gate,
    GateState,
    PolicyRefresh,
    Quarantine,
    QuarantineState,
    RefreshState,
    Serving,
)
from tests.integration.drift.test_drift_quarantine import detected_within_two_discoveries
from tests.integration.refresh.helpers import actor_for, make_source, plan, run_inline, wait_for
from tests.interop.conftest import WorkerSpec

pytestmark = [pytest.mark.interop, pytest.mark.django_db(transaction=True)]


def _readback(worker) -> dict:
    response = httpx.post(f"{worker.system_url}/engine/get_weight_version", json={}, timeout=10)
    response.raise_for_status()
    return response.json()


def _live(dep) -> dict[str, str]:
    """Instance id -> system URL of every healthy worker the listener lists."""
    return {
        str(e["instance_id"]): e["system_url"].rstrip("/")
        for e in dep.listing().get("workers", [])
        if e.get("system_url") and e.get("status") != "error"
    }


def test_the_ledger_matches_real_readbacks_after_catch_up_and_force_reopen(
    dynamo_deployment, celery_worker, operator, approver, viewer_client
):
    dep = dynamo_deployment(
        [
            WorkerSpec("backend", namespace="rl-a", model_name="tiny-a"),
            WorkerSpec("backend", namespace="rl-b", model_name="tiny-b"),
            WorkerSpec("spare", namespace="rl-b", model_name="tiny-s"),
        ],
        frontend_env={"DYN_NAMESPACE_PREFIX": "rl"},
    )
    source = make_source(dep, name="real")
    first = run_inline(source, operator, "policy-9")
    assert first.state == RefreshState.SUCCEEDED, f"{first.held_reason}\n{dep.diagnostics()}"

    # A worker restarts on its base weights; drift quarantines it and catches it up.
    restarted = dep.worker("backend", "rl-a")
    before = set(_live(dep))
    restarted.restart()
    (new_id,) = wait_for(lambda: set(_live(dep)) - before, timeout=90)
    detected_within_two_discoveries(
        source,
        lambda: Quarantine.objects.filter(
            instance_id=new_id, state=QuarantineState.ADMITTED
        ).first(),
        timeout=120,
    )

    # A refresh of rl-b to policy-10 holds (its spare worker's process is gone once it
    # started); the approver force-reopens rl-b, and the executor resumes what it paused.
    held = plan(
        source,
        operator,
        target={"weight_version": "policy-10", "method": "disk", "model_path": "/ckpt/10"},
        namespaces=["rl-b"],
    )
    assert not held.plan_blockers, held.plan_blockers
    dep.worker("spare", "rl-b").stop()
    intents.start_policy_refresh(held, actor=actor_for(operator), enqueue=False)
    execute_refresh(held.pk)
    held.refresh_from_db()
    assert held.state == RefreshState.HELD, f"{held.state}\n{dep.diagnostics()}"
    gate = Gate.objects.get(source=source, namespace="rl-b")
    intents.force_reopen_gate(gate, actor=actor_for(approver), reason="rl-b checked by hand")
    wait_for(
        lambda: PolicyRefresh.objects.filter(pk=held.pk, state=RefreshState.FAILED).exists(),
        timeout=60,
    )
    assert Gate.objects.get(pk=gate.pk).state == GateState.OPEN_FORCED

    # The ledger's now, per instance, is what each real worker says it holds.
    live = _live(dep)
    assert new_id in live and len(live) == 2, live
    readbacks = {}
    for instance_id, url in live.items():
        response = httpx.post(f"{url}/engine/get_weight_version", json={}, timeout=10)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "ok" and body["version_declared"] is True, body
        readbacks[instance_id] = body["version"]
    assert _readback(restarted)["version"] == readbacks[new_id] == "policy-9"
    now = {
        row.instance_id: row
        for row in ledger.current(source, ["rl-a", "rl-b"])
        if row.serving != Serving.DEPARTED
    }
    assert {iid: row.version for iid, row in now.items()} == readbacks
    assert now[new_id].evidence == Evidence.VERIFIED_CATCH_UP
    assert now[new_id].admission == Admission.VERIFIED
    (rl_b_id,) = [iid for iid, row in now.items() if row.namespace == "rl-b"]
    assert now[rl_b_id].evidence == Evidence.REPORTED
    assert now[rl_b_id].admission == Admission.FORCED

    # Provenance answers those versions for those instances now.
    at = timezone.now().isoformat()
    for instance_id, version in readbacks.items():
        response = viewer_client.get("/api/v1/provenance", {"instance_id": instance_id, "at": at})
        assert response.status_code == 200, response.content
        (interval,) = response.json()["intervals"]
        assert interval["versions"] == [version], interval
        assert interval["confidence"] == ("verified" if instance_id == new_id else "forced")
