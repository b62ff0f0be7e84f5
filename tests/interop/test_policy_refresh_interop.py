"""`manage.py policy_refresh` against real Dynamo 1.6.1: a healthy set and a plan-time refusal.

The command runs in-process (the Celery task's executor, in a thread of the command): fresh
discovery through the real RL listener, admin calls on the workers' real system servers, and
the generation check through the real frontend pinned to each worker with
`nvext.backend_instance_id`. The worker state is then checked independently with plain httpx
(`get_weight_version`, `/engine/interop/state`).
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.refresh.gates import gate_state
from controlplane.refresh.models import (
    Gate,
    JournalEntry,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
    StepRun,
    WorkerStepResult,
)
from tests.integration.refresh.cli import cli
from tests.interop.conftest import DynamoDeployment, RunningWorker, WorkerSpec
from tests.interop.programs.synthetic_model import policy_tokens

pytestmark = [pytest.mark.interop, pytest.mark.django_db(transaction=True)]

PROMPT = [5, 6, 7, 8]
VERSION = "policy-9"
MODEL_PATH = "/ckpt/9"


def _register(dep: DynamoDeployment, name: str = "real"):
    return services.create_source(
        actor=Actor.system("interop"),
        name=name,
        listener_url=dep.listener_url,
        frontend_url=dep.frontend_url,
        allowed_networks=["127.0.0.0/8"],
    )


def _engine(worker: RunningWorker, route: str) -> dict:
    """POST one engine route on the worker's real system server, with plain httpx."""
    response = httpx.post(f"{worker.system_url}/engine/{route}", json={}, timeout=10)
    response.raise_for_status()
    return response.json()


def _policy_refresh(source_name: str, *args: str) -> tuple[int, str, str]:
    """Run the command in-process as an operator; (exit code, stdout, stderr)."""
    create_user_with_role("interop-operator", Role.OPERATOR, "interop-pass-1234", validate=False)
    argv = [source_name, "--weight-version", VERSION, "--model-path", MODEL_PATH, "--yes"]
    return cli("policy_refresh", *argv, *args, "--as", "interop-operator")


def test_policy_refresh_succeeds_on_real_workers_across_two_namespaces(dynamo_deployment):
    dep = dynamo_deployment(
        [
            WorkerSpec("backend", namespace="rl-a", model_name="tiny-a"),
            WorkerSpec("backend", namespace="rl-b", model_name="tiny-b"),
        ],
        # The listener's default scope is exactly `dynamo`; a prefix scope covers rl-a and rl-b.
        frontend_env={"DYN_NAMESPACE_PREFIX": "rl"},
    )
    workers = dep.workers
    for worker in workers:
        # Nothing declared yet, serving, and generating the "undeclared" policy.
        assert _engine(worker, "get_weight_version")["version_declared"] is False
    source = _register(dep)

    code, out, err = _policy_refresh(
        source.name, "--namespace", "rl-a", "--namespace", "rl-b", "--flush", "always"
    )
    assert code == 0, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}\n{dep.diagnostics()}"
    assert f"succeeded at {VERSION}" in out

    refresh = PolicyRefresh.objects.get(source=source)
    assert refresh.state == RefreshState.SUCCEEDED
    assert refresh.namespaces == ["rl-a", "rl-b"]
    assert refresh.plan_blockers == []
    assert refresh.finished_at is not None and not refresh.held_reason
    assert not ScopeLock.objects.filter(refresh=refresh).exists()
    planned = {w.namespace: w for w in refresh.workers.all()}
    assert set(planned) == {"rl-a", "rl-b"}
    for worker in planned.values():
        assert worker.family == "vllm" and worker.blockers == []
    # Every step ran once and succeeded, in order; every worker got an ok result per step.
    assert list(StepRun.objects.filter(refresh=refresh).values_list("name", "status")) == [
        ("gate", "ok"),
        ("resolve", "ok"),
        ("pause", "ok"),
        ("update", "ok"),
        ("flush", "ok"),
        ("resume_engines", "ok"),
        ("verify", "ok"),
        ("reopen", "ok"),
    ]
    results = WorkerStepResult.objects.filter(refresh=refresh)
    assert {r.status for r in results} == {"ok"}
    assert results.count() == 2 * 5

    # The journal: exactly the expected calls per worker, all ok, against the real processes.
    journal = JournalEntry.objects.filter(refresh=refresh)
    assert all(entry.ok for entry in journal), [(e.operation, e.error) for e in journal]
    for namespace, worker in planned.items():
        real = dep.worker("backend", namespace)
        entries = list(journal.filter(planned_worker=worker))
        engine = f"{real.system_url}/engine/"
        assert [(e.step, e.operation, e.url.removeprefix(engine)) for e in entries] == [
            ("pause", "pause", "pause_generation"),
            ("update", "update_from_disk", "update_weights_from_disk"),
            ("flush", "flush_cache", "flush_cache"),
            ("resume_engines", "resume", "resume_generation"),
            ("verify", "get_weight_version", "get_weight_version"),
            ("verify", "liveness", "liveness_probe"),
            ("verify", "generation", f"{dep.frontend_url}/v1/completions"),
        ], namespace
        assert all(e.http_status == 200 for e in entries)
        by_op = {e.operation: e for e in entries}
        assert by_op["pause"].request_body == {"mode": "wait"}
        assert by_op["update_from_disk"].request_body == {
            "model_path": MODEL_PATH,
            "weight_version": VERSION,
        }
        assert by_op["update_from_disk"].response_body["version"] == VERSION
        assert by_op["get_weight_version"].response_body == {
            "status": "ok",
            "version": VERSION,
            "version_declared": True,
        }
        generation = by_op["generation"]
        assert generation.request_body["nvext"]["backend_instance_id"] == int(worker.instance_id)
        assert generation.response_body["model"] == worker.model
        # The pinned worker generated with the new policy's weights, not the undeclared ones.
        ids = generation.response_body["nvext"]["completion_token_ids"]
        # As many tokens as the agreement rule compares (k = 8 by default), at least.
        assert len(ids) >= 8
        assert ids == policy_tokens(VERSION, PROMPT, len(ids))
        assert ids != policy_tokens(None, PROMPT, len(ids))
    # Fleet-level rows: listener reads at resolve and at reopen, and one cross-worker agreement
    # check per model, which the real workers passed.
    fleet_rows = journal.filter(planned_worker=None)
    assert Counter(fleet_rows.values_list("operation", flat=True)) == {
        "discovery": 2,
        "agreement": refresh.workers.values("model").distinct().count(),
    }
    assert all(row.ok for row in fleet_rows.filter(operation="agreement"))

    # The real workers, read directly: new version declared, weights loaded, engines resumed.
    for worker in workers:
        assert _engine(worker, "get_weight_version") == {
            "status": "ok",
            "version": VERSION,
            "version_declared": True,
        }
        state = _engine(worker, "interop/state")
        assert state["paused"] is False
        assert state["version"] == VERSION
        assert state["rpc_log"] == [["reload_weights", {"weights_path": MODEL_PATH}]]
        # One from the reload itself (vLLM resets the prefix cache) and one from flush_cache.
        assert state["cache_flushes"] == 2

    # Both gates are open at the verified version and name no refresh.
    for namespace in ("rl-a", "rl-b"):
        gate = gate_state(source, namespace)
        assert gate["open"] is True, gate
        assert gate["verified_version"] == VERSION
        assert gate["active_refresh_id"] is None
        assert gate["reason"] == ""
        # Closed once, opened once.
        assert gate["revision"] == 3


def test_policy_refresh_refuses_at_plan_time_when_a_worker_lacks_the_update_route(
    dynamo_deployment,
):
    dep = dynamo_deployment(
        [
            WorkerSpec("backend", model_name="tiny-policy"),
            WorkerSpec(
                "partial", model_name="tiny-policy", omit_routes=("update_weights_from_disk",)
            ),
        ]
    )
    source = _register(dep)

    # Generation verification stays on: the only blocker is the missing route.
    code, out, err = _policy_refresh(source.name)
    assert code == 1, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    assert "refused at plan time" in err
    assert "1 of 2 workers have blockers" in err
    # The printed plan names the missing route and the worker it blocks (grouped by blocker).
    assert any(
        "BLOCKED: update: vllm disk reload needs update_weights_from_disk" in line
        and "dynamo/partial/" in line
        for line in out.splitlines()
    ), out

    refresh = PolicyRefresh.objects.get(source=source)
    assert refresh.state == RefreshState.PLANNED
    assert refresh.plan_blockers == ["1 of 2 workers have blockers"]
    blocked = refresh.workers.get(key__startswith="dynamo/partial/")
    assert blocked.blockers == [
        "update: vllm disk reload needs update_weights_from_disk, "
        "which the worker does not advertise"
    ]
    assert blocked.calls["update"] == []
    assert refresh.workers.get(key__startswith="dynamo/backend/").blockers == []
    # Nothing started: no lock, no steps, no journal, and the gate was never touched.
    assert not ScopeLock.objects.exists()
    assert not StepRun.objects.exists()
    assert not JournalEntry.objects.exists()
    assert not Gate.objects.exists()
    gate = gate_state(source, "dynamo")
    # Never refreshed: unverified, not open (it used to answer open with nothing verified).
    assert gate["state"] == "unverified" and gate["open"] is False
    assert gate["active_refresh_id"] is None

    # The real workers were neither paused nor updated.
    for worker in dep.workers:
        assert _engine(worker, "get_weight_version") == {
            "status": "ok",
            "version": None,
            "version_declared": False,
        }
        state = _engine(worker, "interop/state")
        assert state["paused"] is False
        assert state["rpc_log"] == []
        assert state["loaded_path"] is None
