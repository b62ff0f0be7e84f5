"""Pinned generation across replicas of one model on real Dynamo 1.6.1.

The verify step pins its generation check to each worker with `nvext.backend_instance_id`, so
every replica of a model must be routable by the id `/v1/rl/workers` lists. The 1.6.1 frontend
groups a model's generate instances into a worker set per (namespace, component, endpoint) and
model card checksum (`mdcsum`), and keeps only the *first* checksum it sees: an instance whose
card differs is rejected ("Rejected incompatible workers"), stays listed by the RL listener and
in `/health`, but is not routable, so a request pinned to it gets HTTP 400 "Invalid request".
The checksum covers the card's `source_path` (the model directory the worker registered), so
replicas that register the same files from different paths are already "incompatible".
"""

from __future__ import annotations

import time

import httpx
import pytest

from controlplane.dynamo.discovery import fetch_discovery
from controlplane.dynamo.generation import GenerationCheck, run_generation_check
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from tests.interop.conftest import DynamoDeployment, WorkerSpec
from tests.interop.programs.synthetic_model import policy_tokens

pytestmark = pytest.mark.interop

LOOPBACK = OutboundPolicy.from_cidrs(["127.0.0.0/8"])
DISCOVERY_TIMEOUT = 20.0
PROMPT = (5, 6, 7, 8)
REJECTED = "Rejected incompatible workers"


async def _listed_ids(dep: DynamoDeployment) -> dict[int, str]:
    """instance_id -> system_url, as our client reads the real listener."""
    async with make_client(timeout=DISCOVERY_TIMEOUT) as client:
        result = await fetch_discovery(
            client, LOOPBACK, dep.listener_url, timeout=DISCOVERY_TIMEOUT
        )
    assert all(w.available for w in result.workers), result.workers
    return {w.identity.instance_id: str(w.system_url) for w in result.workers}


def _set_version(system_url: str, version: str) -> None:
    reply = httpx.post(
        f"{system_url}/engine/set_weight_version", json={"weight_version": version}, timeout=10
    )
    reply.raise_for_status()
    assert reply.json() == {"status": "ok", "version": version}


def _pinned(model: str, instance_id: int) -> GenerationCheck:
    return GenerationCheck(
        model=model,
        prompt_token_ids=PROMPT,
        max_tokens=4,
        backend_instance_id=instance_id,
        expected_model=model,
    )


async def test_each_of_three_same_model_replicas_answers_its_own_pinned_check(
    dynamo_deployment,
):
    dep = dynamo_deployment(
        [WorkerSpec("backend", namespace="rl-a", model_name="tiny-a") for _ in range(3)],
        frontend_env={"DYN_NAMESPACE_PREFIX": "rl"},
    )
    listed = await _listed_ids(dep)
    assert len(listed) == 3
    # A distinct version per replica makes the tokens say which replica generated them.
    versions = {iid: f"replica-{n}" for n, iid in enumerate(sorted(listed))}
    for iid, version in versions.items():
        _set_version(listed[iid], version)

    async with make_client(timeout=30) as client:
        for iid, version in versions.items():
            verdict = await run_generation_check(
                client, LOOPBACK, dep.frontend_url, _pinned("tiny-a", iid), timeout=30
            )
            assert verdict.ok, f"{iid}: {verdict.reason}\n{dep.diagnostics()}"
            # Routed to exactly the pinned instance, which ran its own policy.
            assert verdict.body["nvext"]["worker_id"]["decode_worker_id"] == iid
            assert list(verdict.completion_token_ids) == policy_tokens(version, list(PROMPT), 4)
    assert REJECTED not in dep.frontend.log_path.read_text(errors="replace")


async def test_a_replica_with_a_different_model_card_is_listed_but_not_routable(
    dynamo_deployment,
):
    # Same files, same model name, two directories: two card checksums for one worker set.
    dep = dynamo_deployment(
        [
            WorkerSpec("backend", namespace="rl-a", model_name="tiny-a", model_dir="ckpt-1"),
            WorkerSpec("backend", namespace="rl-a", model_name="tiny-a", model_dir="ckpt-2"),
        ],
        frontend_env={"DYN_NAMESPACE_PREFIX": "rl"},
    )
    listed = await _listed_ids(dep)
    assert len(listed) == 2
    # The RL listener still names the model on both entries: it reads each instance's own card.
    assert {w["model"] for w in dep.listing()["workers"]} == {"tiny-a"}

    verdicts = {}
    async with make_client(timeout=30) as client:
        for iid in listed:
            verdicts[iid] = await run_generation_check(
                client, LOOPBACK, dep.frontend_url, _pinned("tiny-a", iid), timeout=30
            )
    routable = [iid for iid, v in verdicts.items() if v.ok]
    refused = [iid for iid, v in verdicts.items() if not v.ok]
    # Whichever card the frontend saw first keeps the set; the other replica is refused.
    assert len(routable) == 1 and len(refused) == 1, {k: v.reason for k, v in verdicts.items()}
    refusal = verdicts[refused[0]]
    assert refusal.http_status == 400
    assert refusal.body == {"message": "Invalid request", "type": "Bad Request", "code": 400}
    # The verdict names the likely causes instead of only "is it still alive?".
    assert str(refused[0]) in refusal.reason and "model card" in refusal.reason

    # The frontend says why, once it has seen both cards (poll its log, bounded).
    deadline = time.monotonic() + 15
    while REJECTED not in dep.frontend.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, dep.diagnostics()
        time.sleep(0.2)
