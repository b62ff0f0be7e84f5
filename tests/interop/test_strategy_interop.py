"""A `waves` refresh with `max_unavailable=1` on real Dynamo 1.6.1 workers: from the workers'
own records of when they were paused and resumed, no two were ever paused at once, and every
replica proved through a generation check pinned to it that it serves the new policy."""

from __future__ import annotations

import itertools

import httpx
import pytest

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.gates import gate_state
from controlplane.refresh.models import JournalEntry, RefreshState
from tests.interop.conftest import WorkerSpec
from tests.interop.programs.synthetic_model import policy_tokens

pytestmark = [pytest.mark.interop, pytest.mark.django_db(transaction=True)]

VERSION = "policy-11"
PROMPT = [5, 6, 7, 8]  # the plan's default generation prompt


def _state(worker) -> dict:
    response = httpx.post(f"{worker.system_url}/engine/interop/state", json={}, timeout=10)
    response.raise_for_status()
    return response.json()


def test_waves_of_one_never_pause_two_real_workers_at_once(dynamo_deployment, operator):
    dep = dynamo_deployment(
        [
            # Three replicas of one model (one model directory, as one checkpoint): the
            # frontend routes each pinned generation check to exactly that replica.
            WorkerSpec("backend", namespace="rl-a", model_name="tiny-a"),
            WorkerSpec("backend", namespace="rl-a", model_name="tiny-a"),
            WorkerSpec("backend", namespace="rl-a", model_name="tiny-a"),
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
    actor = Actor.for_user(operator)
    refresh = intents.plan_policy_refresh(
        source=source,
        actor=actor,
        target={"weight_version": VERSION, "method": "disk", "model_path": "/ckpt/11"},
        namespaces=["rl-a"],
        strategy={"kind": "waves", "max_unavailable": 1},
    )
    assert refresh.plan_blockers == [], refresh.plan_blockers
    assert refresh.waves == 3
    intents.start_policy_refresh(refresh, actor=actor, enqueue=False)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, f"{refresh.held_reason}\n{dep.diagnostics()}"

    spans = []
    for worker in dep.workers:
        state = _state(worker)
        assert state["paused"] is False and state["version"] == VERSION
        log = state["pause_log"]
        # Paused once and resumed once, by the worker's own account.
        assert [event for event, _ in log] == ["paused", "resumed"], log
        spans.append((log[0][1], log[1][1]))
    spans.sort()
    for (_, earlier_end), (later_start, _) in itertools.pairwise(spans):
        assert later_start >= earlier_end, spans
    # Each wave's generation check was pinned to that wave's replica, answered by it, with the
    # new policy's ids.
    journal = JournalEntry.objects.filter(refresh=refresh)
    generations = list(journal.filter(operation="generation"))
    planned = {w.pk: int(w.instance_id) for w in refresh.workers.all()}
    assert sorted(g.planned_worker_id for g in generations) == sorted(planned)
    for entry in generations:
        assert entry.ok and entry.http_status == 200, entry.error
        pinned = entry.request_body["nvext"]["backend_instance_id"]
        assert pinned == planned[entry.planned_worker_id]
        nvext = entry.response_body["nvext"]
        assert nvext["worker_id"]["decode_worker_id"] == pinned
        ids = nvext["completion_token_ids"]
        assert ids == policy_tokens(VERSION, PROMPT, len(ids))
        assert ids != policy_tokens(None, PROMPT, len(ids))
    # Agreement is judged after every wave over all workers verified so far; the last one
    # compared all three replicas.
    agreements = list(journal.filter(operation="agreement").order_by("id"))
    assert agreements and all(a.ok for a in agreements), [a.error for a in agreements]
    assert len(agreements[-1].request_body["workers"]) == 3

    gate = gate_state(source, "rl-a")
    assert gate["open"] is True and gate["verified_version"] == VERSION
    assert gate["verified_count"] == 3 and gate["instance_sets"] == {}
