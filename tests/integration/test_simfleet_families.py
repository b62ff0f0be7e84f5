"""Native vLLM sidecar and SGLang system servers, driven through the dynamo client families."""

from __future__ import annotations

import httpx

from controlplane.dynamo.admin import call_admin
from controlplane.dynamo.families import SGLANG, VLLM_SIDECAR, Operation, detect_family
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.simfleet import FleetConfig, WorkerSpec
from controlplane.simfleet.workers.sglang import SGLANG_CONFIGURED_ROUTES

POLICY = OutboundPolicy.from_cidrs(["127.0.0.0/8"])


async def run_op(system_url, family, op, **params):
    async with make_client(timeout=5) as client:
        result = None
        for call in family.build(op, **params):
            result = await call_admin(client, POLICY, system_url, family, call, timeout=5)
            if not result.ok:
                break
        return result


def models(fleet) -> list[str]:
    return [m["id"] for m in httpx.get(f"{fleet.frontend_url}/v1/models").json()["data"]]


async def test_sidecar_sequence_and_routing(simfleet_factory):
    fleet = simfleet_factory(FleetConfig(workers=[WorkerSpec(family="vllm-sidecar", world_size=2)]))
    (entry,) = httpx.get(f"{fleet.listener_url}/v1/rl/workers").json()["workers"]
    url = entry["system_url"]
    assert detect_family(entry["routes"]) is VLLM_SIDECAR
    assert (await run_op(url, VLLM_SIDECAR, Operation.GET_WEIGHT_VERSION)).body == {
        "weight_version": ""
    }
    assert (await run_op(url, VLLM_SIDECAR, Operation.PAUSE)).body == {"status": "paused"}
    # Paused sidecar: unregistered from generation but still listed by the RL listener.
    assert models(fleet) == []
    assert len(httpx.get(f"{fleet.listener_url}/v1/rl/workers").json()["workers"]) == 1
    assert httpx.post(f"{url}/engine/control/is_paused").json() == {"is_paused": True}
    # vLLM's NCCL transfer engine needs its NCCLInitInfo fields (this sidecar holds 2 ranks).
    incomplete = await run_op(url, VLLM_SIDECAR, Operation.INIT_WEIGHTS_GROUP, init_info={"a": 1})
    assert incomplete.http_status == 500 and not incomplete.ok
    info = {"master_address": "h", "master_port": 29500, "rank_offset": 1, "world_size": 3}
    init = await run_op(url, VLLM_SIDECAR, Operation.INIT_WEIGHTS_GROUP, init_info=info)
    assert init.body == {"message": "Weight transfer initialized"}
    # The stand-in trainer (rank 0) broadcasts; only then is there anything to apply.
    assert fleet.broadcast("v7") == 1
    update = await run_op(
        url,
        VLLM_SIDECAR,
        Operation.UPDATE_FROM_DISTRIBUTED,
        update_infos=[{"n": 1}, {"n": 2}],
        weight_version="v7",
    )
    assert update.ok and update.body == {"message": "Weight update finished"}
    assert (await run_op(url, VLLM_SIDECAR, Operation.GET_WEIGHT_VERSION)).body == {
        "weight_version": "v7"
    }
    assert (await run_op(url, VLLM_SIDECAR, Operation.RESUME)).body == {"status": "resumed"}
    assert models(fleet) == ["sim-model"]
    assert httpx.get(f"{url}/health").json() == {"status": "ready"}


def test_sidecar_error_shapes(simfleet_factory):
    fleet = simfleet_factory(FleetConfig(workers=[WorkerSpec(family="vllm-sidecar")]))
    url = fleet.workers()[0]["system_url"]

    def post(route, body):
        response = httpx.post(f"{url}/engine/{route}", json=body)
        return response.status_code, response.json()

    assert post("control/pause_generation", {"mode": "bogus"}) == (
        200,
        {
            "status": "error",
            "message": "InvalidRequest: pause_generation mode must be abort, wait, or keep; "
            "got `bogus`",
        },
    )
    assert post("control/pause_generation", {"clear_cache": "y"})[1]["message"] == (
        "InvalidRequest: `clear_cache` must be a boolean"
    )
    assert post("control/pause_generation", [1]) == (
        200,
        {"status": "error", "message": "engine control request body must be a JSON object"},
    )
    assert post("update/init_weight_transfer_engine", {}) == (
        500,
        {"error": "Handler error", "message": "InvalidRequest: missing `init_info` JSON object"},
    )
    assert post("update/update_weight_version", {"new_version": ""})[1]["message"] == (
        "InvalidRequest: missing non-empty `new_version` string"
    )
    assert post("update/update_weight_version", {"new_version": "v3"}) == (
        200,
        {"success": True, "new_version": "v3"},
    )
    assert post("control/sleep", {"level": 5})[1]["message"] == (
        "InvalidRequest: `level` must be one of 0, 1, or 2"
    )
    assert post("control/sleep", {}) == (200, {"status": "sleeping"})
    assert post("control/resume_generation", {}) == (
        200,
        {"status": "resumed", "is_sleeping": True},
    )
    assert post("control/wake_up", {"tags": ["weights"]}) == (
        200,
        {"status": "partially_awake", "is_sleeping": True},
    )
    assert post("control/wake_up", {}) == (200, {"status": "awake"})
    assert models(fleet) == ["sim-model"]
    assert httpx.post(f"{url}/engine/update/start_draft_weight_update").status_code == 404


async def test_failed_sidecar_pause_still_unregisters(simfleet_factory):
    fleet = simfleet_factory(FleetConfig(workers=[WorkerSpec(family="vllm-sidecar")]))
    key = fleet.workers()[0]["key"]
    fleet.inject(key, "control/pause_generation", {"kind": "http_error", "once": True})
    result = await run_op(fleet.workers()[0]["system_url"], VLLM_SIDECAR, Operation.PAUSE)
    assert result.http_status == 500 and not result.ok
    assert models(fleet) == []


async def test_sglang_registered_by_url(simfleet_factory):
    fleet = simfleet_factory(
        FleetConfig(
            workers=[WorkerSpec(family="sglang", engine_routes=list(SGLANG_CONFIGURED_ROUTES))]
        )
    )
    assert httpx.get(f"{fleet.listener_url}/v1/rl/workers").json()["workers"] == []
    (worker,) = fleet.workers()
    url = worker["system_url"]
    assert (await run_op(url, SGLANG, Operation.LIVENESS)).ok
    assert (await run_op(url, SGLANG, Operation.PAUSE)).body == {"status": "ok"}
    assert models(fleet) == []  # discovery follows is_pause
    update = await run_op(url, SGLANG, Operation.UPDATE_FROM_DISK, model_path="/c")
    assert update.body == {
        "success": True,
        "message": "Succeeded to update model weights.",
        "num_paused_requests": 0,
    }
    assert (await run_op(url, SGLANG, Operation.SET_WEIGHT_VERSION, weight_version="v4")).body == {
        "success": True,
        "message": "Weight version updated to v4",
        "new_version": "v4",
    }
    assert (await run_op(url, SGLANG, Operation.FLUSH_CACHE)).ok
    version = await run_op(url, SGLANG, Operation.GET_WEIGHT_VERSION)
    assert version.ok and version.data["version"] == "v4"
    assert (await run_op(url, SGLANG, Operation.RESUME)).ok
    assert models(fleet) == ["sim-model"]
    bad = httpx.post(f"{url}/engine/control/update_weights_from_disk", json={"bogus": 1})
    assert bad.status_code == 500 and "unexpected keyword argument 'bogus'" in bad.json()["message"]
    assert fleet.state(worker["key"])["flush_count"] == 1
