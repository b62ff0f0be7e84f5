"""The distributed update's group lifecycle against real Dynamo 1.6.1 workers.

Scripted workers on the real runtime (`programs/vllm_rl_worker.py`) rendezvous like a
collective: `init_weights_update_group` blocks until every rank of the world — the trainer's
rank 0 included — has joined (files under `INTEROP_GROUP_DIR`), under the real watchdog
variable, and the distributed update refuses to apply before the trainer's broadcast. The
control plane finds them through the real RL listener and drives init on all ranks →
`group_ready` → the trainer's `broadcast_done` → update → readback → destroy → verify.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from django.db import connection

from controlplane.audit.recorder import Actor
from controlplane.fleet import discovery, services
from controlplane.fleet.models import DiscoveryTrigger
from controlplane.refresh import handshake, intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import JournalEntry, PolicyRefresh, RefreshState
from tests.interop.conftest import WorkerSpec

pytestmark = [pytest.mark.interop, pytest.mark.django_db(transaction=True)]

VERSION = "policy-12"


def _state(worker) -> dict:
    response = httpx.post(f"{worker.system_url}/engine/interop/state", json={}, timeout=10)
    response.raise_for_status()
    return response.json()


def test_group_lifecycle_on_real_workers(dynamo_deployment, tmp_path):
    group_dir = tmp_path / "group"
    env = {"INTEROP_GROUP_DIR": str(group_dir), "DYN_RL_INIT_WEIGHTS_TIMEOUT_S": "30"}
    dep = dynamo_deployment(
        [
            # One model (a broadcast feeds one set of weights; the plan refuses a mix).
            WorkerSpec("backend", namespace="rl-a", model_name="tiny", world_size=2, env=env),
            WorkerSpec("backend", namespace="rl-a", model_name="tiny", env=env),
        ],
        frontend_env={"DYN_NAMESPACE_PREFIX": "rl"},
    )
    source = services.create_source(
        actor=Actor.system("interop"),
        name="real",
        listener_url=dep.listener_url,
        frontend_url=dep.frontend_url,
        allowed_networks=["127.0.0.0/8"],
    )
    discovery.run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=15)
    actor = Actor.system("interop")
    refresh = intents.plan_policy_refresh(
        source=source,
        actor=actor,
        target={
            "weight_version": VERSION,
            "method": "distributed",
            "group": {"master_address": "127.0.0.1", "master_port": 29512},
            "update": {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[4, 4]]},
            "init_timeout_s": 20,
            "broadcast_timeout_s": 60,
        },
        versions={"dynamo": "1.6.1"},
    )
    assert not refresh.plan_blockers, refresh.plan_blockers
    assert refresh.group["world_size"] == 4  # the trainer's rank 0, then 2 + 1 worker ranks
    intents.start_policy_refresh(refresh, actor=actor, enqueue=False)

    done: list[str] = []

    def run() -> None:
        try:
            done.append(execute_refresh(refresh.pk))
        finally:
            connection.close()

    executor = threading.Thread(target=run, daemon=True)
    executor.start()
    # The trainer: join as rank 0, wait for every worker rank, broadcast, report.
    group_dir.mkdir(parents=True, exist_ok=True)
    (group_dir / "rank-0").write_text("trainer")
    deadline = time.monotonic() + 60
    while (PolicyRefresh.objects.get(pk=refresh.pk).group or {}).get("state") != handshake.READY:
        assert time.monotonic() < deadline, "the group never formed"
        assert executor.is_alive(), done
        time.sleep(0.1)
    # Every worker joined and is blocked in nothing: nothing was applied yet.
    assert sorted(p.name for p in group_dir.iterdir()) == ["rank-0", "rank-1", "rank-2", "rank-3"]
    assert all(_state(w)["version"] is None for w in dep.workers)
    (group_dir / "broadcast").write_text(VERSION)
    handshake.report_broadcast_done(refresh, actor=Actor.system("trainer"), weight_version=VERSION)
    executor.join(90)

    refresh.refresh_from_db()
    assert done == [RefreshState.SUCCEEDED], refresh.held_reason
    assert refresh.group["state"] == handshake.DESTROYED
    # Each real worker: joined with its own ranks, applied, was destroyed, reads VERSION back.
    offsets = set()
    for worker in dep.workers:
        state = _state(worker)
        names = [name for name, _ in state["rpc_log"]]
        assert names == ["init_broadcaster", "update_weights_from_path", "destroy_broadcaster"]
        init = state["rpc_log"][0][1]
        assert init["world_size"] == 4 and init["master_port"] == 29512
        offsets.add(init["rank_offset"])
        assert state["version"] == VERSION and not state["paused"]
    planned = sorted((w.rank_offset, w.ranks) for w in refresh.workers.all())
    assert planned in ([(1, 2), (3, 1)], [(1, 1), (2, 2)])  # key order decides who goes first
    assert offsets == {offset for offset, _ in planned}
    assert sorted(p.name for p in group_dir.iterdir()) == ["broadcast", "rank-0"]
    joins = JournalEntry.objects.filter(refresh=refresh, step="group_init")
    assert joins.count() == 2 and all(j.ok for j in joins)
    assert max(j.started_at for j in joins) < min(j.finished_at for j in joins)
    assert refresh.compat["verification"]["ran"]["ok"] is True
    # Both replicas answered a generation check pinned to them (the plan's default check).
    generations = JournalEntry.objects.filter(refresh=refresh, operation="generation")
    assert generations.count() == 2 and all(g.ok for g in generations)
    for entry in generations:
        pinned = entry.request_body["nvext"]["backend_instance_id"]
        assert entry.response_body["nvext"]["worker_id"]["decode_worker_id"] == pinned
