"""Static workers and rejected listener entries against real Dynamo 1.6.1.

- A worker the listener does not report (its component is outside `DYN_RL_COMPONENTS`, as an
  SGLang worker is outside RL discovery) is registered as a static worker. Its instance id is
  read from the real frontend's `GET /health` instances, and the post-update generation check
  pins to it through that frontend (`nvext.backend_instance_id`): an invented id would be
  answered with HTTP 400. A declared id the frontend does not list is refused, naming the
  worker, and nothing is paused.
- A worker whose descriptor our parser rejects (a `system_url` that is not HTTP, which the real
  listener passes through as it is) blocks a plan of its namespace with the rejection reason.
"""

from __future__ import annotations

import httpx
import pytest

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.discovery.runner import run_discovery
from controlplane.fleet.models import DiscoveryTrigger, StaticWorker, Worker, WorkerState
from controlplane.refresh.models import Gate, JournalEntry, RefreshState
from tests.integration.refresh.helpers import plan, run_inline
from tests.interop.conftest import RunningWorker, WorkerSpec

pytestmark = [pytest.mark.interop, pytest.mark.django_db(transaction=True)]

SYSTEM = Actor.system("interop")
VLLM_ROUTES = [
    "pause_generation",
    "resume_generation",
    "flush_cache",
    "update_weights_from_disk",
    "get_weight_version",
    "liveness_probe",
]


def _state(worker: RunningWorker) -> dict:
    reply = httpx.post(f"{worker.system_url}/engine/interop/state", json={}, timeout=10)
    reply.raise_for_status()
    return reply.json()


def _registered(frontend_url: str, namespace: str, component: str) -> list[int]:
    """Instance ids of `namespace/component/generate` in the real frontend's /health."""
    health = httpx.get(f"{frontend_url}/health", timeout=10).json()
    return [
        i["instance_id"]
        for i in health["instances"]
        if (i["namespace"], i["component"], i["endpoint"]) == (namespace, component, "generate")
    ]


def test_a_static_worker_is_pinned_under_the_id_the_real_frontend_registered(
    dynamo_deployment, operator
):
    dep = dynamo_deployment(
        [
            WorkerSpec("backend", namespace="rl-a", model_name="tiny-a"),
            # Its own model: the frontend keeps one worker set per (namespace, component,
            # endpoint) and routes a model to one set, so a pin into another set is refused.
            WorkerSpec("sgl", namespace="rl-a", model_name="tiny-s"),
        ],
        # The listener reports `backend` only: `sgl` is reachable by URL alone, like SGLang.
        frontend_env={"DYN_NAMESPACE": "rl-a", "DYN_RL_COMPONENTS": "backend"},
        expect=1,
    )
    source = services.create_source(
        actor=SYSTEM,
        name="real",
        listener_url=dep.listener_url,
        frontend_url=dep.frontend_url,
        allowed_networks=["127.0.0.0/8"],
        listener_scope="exact",
        expected_namespace="rl-a",
    )
    static = services.add_static_worker(
        source,
        actor=SYSTEM,
        name="sgl-1",
        namespace="rl-a",
        component="sgl",
        system_url=dep.worker("sgl", "rl-a").system_url,
        family="vllm",
        allowed_routes=VLLM_ROUTES,
        model="tiny-s",
    )
    run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=15)

    (registered,) = _registered(dep.frontend_url, "rl-a", "sgl")
    row = Worker.objects.get(source=source, static_worker=static)
    assert row.state == WorkerState.LIVE, row.error
    assert row.instance_id == str(registered) and row.key == f"rl-a/sgl/generate/{registered}"

    refresh = run_inline(source, operator, "policy-7")
    assert refresh.state == RefreshState.SUCCEEDED, f"{refresh.held_reason}\n{dep.diagnostics()}"
    planned = refresh.workers.get(instance_id=str(registered))
    generation = JournalEntry.objects.get(
        refresh=refresh, planned_worker=planned, operation="generation"
    )
    assert generation.ok, generation.error
    assert generation.request_body["nvext"]["backend_instance_id"] == registered
    assert str(registered) in Gate.objects.get(source=source, namespace="rl-a").verified_instances
    assert _state(dep.worker("sgl", "rl-a"))["version"] == "policy-7"

    # A declared id the frontend does not list is refused by name; nothing is paused.
    StaticWorker.objects.filter(pk=static.pk).update(declared_instance_id="12345")
    refused = plan(source, operator, "policy-8")
    blockers = " | ".join(
        [*refused.plan_blockers, *(b for w in refused.workers.all() for b in w.blockers)]
    )
    assert "static worker sgl-1: declared instance id 12345 is not registered at the frontend" in (
        blockers
    ), blockers
    assert not any(_state(w)["paused"] for w in dep.workers)


def test_a_listener_entry_our_parser_rejects_blocks_the_plan(dynamo_deployment, operator):
    dep = dynamo_deployment(
        [
            WorkerSpec("backend", namespace="rl-a", model_name="tiny-a"),
            # The real listener copies `system_url` as given (trimmed): an ftp URL reaches us.
            WorkerSpec(
                "odd",
                namespace="rl-a",
                probe_reply={"routes": ["pause_generation"], "system_url": "ftp://127.0.0.1:21"},
            ),
        ],
        frontend_env={"DYN_NAMESPACE": "rl-a"},
    )
    listed = {e["component"]: e for e in dep.listing()["workers"]}
    assert listed["odd"]["system_url"] == "ftp://127.0.0.1:21" and "error" not in listed["odd"]
    source = services.create_source(
        actor=SYSTEM,
        name="real",
        listener_url=dep.listener_url,
        frontend_url=dep.frontend_url,
        allowed_networks=["127.0.0.0/8"],
    )
    refresh = plan(source, operator, "policy-7")
    blockers = " | ".join(refresh.plan_blockers)
    assert "in namespace 'rl-a' rejected" in blockers and "system_url" in blockers, blockers
    assert not any(_state(w)["paused"] for w in dep.workers if w.spec.component == "backend")
