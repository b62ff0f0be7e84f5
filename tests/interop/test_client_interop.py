"""controlplane.dynamo against real Dynamo 1.6.1: the listener, system servers and frontend."""

from __future__ import annotations

import re

import httpx
import pytest

from controlplane.dynamo.admin import call_admin
from controlplane.dynamo.discovery import DiscoveredWorker, fetch_discovery, parse_discovery
from controlplane.dynamo.families import VLLM_WORKER, detect_family
from controlplane.dynamo.families.base import AdminCall, Operation
from controlplane.dynamo.generation import GenerationCheck, run_generation_check
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.dynamo.scope import Scope
from tests.interop.conftest import DynamoDeployment, WorkerSpec
from tests.interop.programs.synthetic_model import SYNTHETIC_LOGPROB, policy_tokens

pytestmark = pytest.mark.interop

LOOPBACK = OutboundPolicy.from_cidrs(["127.0.0.0/8"])
# Above the frontend's DYN_RL_REQUEST_TIMEOUT_SECS (10 s in the harness), as the client docs ask.
DISCOVERY_TIMEOUT = 20.0
ADMIN_TIMEOUT = 10.0
PROMPT = (5, 6, 7, 8)


async def discover(dep: DynamoDeployment):
    async with make_client(timeout=DISCOVERY_TIMEOUT) as client:
        return await fetch_discovery(client, LOOPBACK, dep.listener_url, timeout=DISCOVERY_TIMEOUT)


def only(result, component: str) -> DiscoveredWorker:
    [worker] = [w for w in result.workers if w.identity.component == component]
    return worker


async def admin(client, worker: DiscoveredWorker, op: Operation, **params):
    """Run one family operation (a single call for the vLLM worker family) and return it."""
    [call] = VLLM_WORKER.build(op, **params)
    return await call_admin(
        client, LOOPBACK, worker.system_url, VLLM_WORKER, call, timeout=ADMIN_TIMEOUT
    )


def declared_version(result) -> tuple:
    """(version, version_declared) as the family extracted them from get_weight_version."""
    return result.data["version"], result.data["version_declared"]


#: Operations a vLLM Python worker started without --enable-lora has no route for.
NOT_ADVERTISED_WITHOUT_LORA = {
    Operation.LOAD_LORA,
    Operation.SWAP_LORA,
    Operation.UNLOAD_LORA,
    Operation.RELEASE_MEMORY,
    Operation.RESUME_MEMORY,
    Operation.IS_PAUSED,
    Operation.IS_SLEEPING,
    Operation.SLEEP,
    Operation.WAKE_UP,
    Operation.CUSTOM,
}


async def test_discovery_parses_real_listing_including_probe_error(dynamo_deployment):
    dep = dynamo_deployment(
        [
            WorkerSpec("backend", model_name="tiny-policy"),
            WorkerSpec("broken", probe_error="engine is dead"),
        ]
    )
    result = await discover(dep)

    assert result.protocol_version == 1
    assert result.namespace == "dynamo"
    assert result.rejected == ()
    assert len(result.workers) == 2

    good = only(result, "backend")
    assert good.available
    assert good.identity.namespace == "dynamo"
    assert good.identity.endpoint == "rl"
    assert good.request_plane_url == "dyn://dynamo.backend.rl"
    assert good.system_url == dep.worker("backend").system_url
    assert good.model == "tiny-policy"
    assert good.world_size == 1
    assert good.admin_base_url is None
    assert "tcp" in good.transport
    # The Python registry advertises exactly the 12 vLLM RL routes, sorted; our debug route
    # (interop/state) is registered on the system server but not in the descriptor.
    assert good.routes == tuple(sorted(good.routes))
    assert len(good.routes) == 12 and "interop/state" not in good.routes
    assert detect_family(good.routes) is VLLM_WORKER
    # Every operation of ours is served by those routes, except the ones this worker has no
    # route for: LoRA (advertised only with --enable-lora), and the other families' own
    # (SGLang memory release, the sidecar's state and sleep routes, allowlisted custom routes).
    supported = {op for op in Operation if VLLM_WORKER.supports(op, good.routes)}
    assert supported == set(Operation) - NOT_ADVERTISED_WITHOUT_LORA, supported

    bad = only(result, "broken")
    assert not bad.available
    assert bad.error == "engine is dead"
    assert bad.routes == ()
    assert bad.system_url is None and bad.world_size is None and bad.model is None

    # instance_id is a u64 (often > 2^53): it must equal the literal digits on the wire.
    raw = httpx.get(f"{dep.listener_url}/v1/rl/workers", timeout=DISCOVERY_TIMEOUT).content
    wire_ids = {int(m) for m in re.findall(rb'"instance_id":(\d+)', raw)}
    assert {w.identity.instance_id for w in result.workers} == wire_ids
    assert parse_discovery(raw).workers == result.workers


async def test_prefix_scoped_listener(dynamo_deployment):
    specs = [
        WorkerSpec("gen", namespace="rlx-a"),
        WorkerSpec("gen", namespace="rlx-b"),
        WorkerSpec("gen", namespace="rlxz"),  # shares the prefix text, not the `rlx-` boundary
    ]
    dep = dynamo_deployment(specs, frontend_env={"DYN_NAMESPACE_PREFIX": "rlx"}, expect=2)
    result = await discover(dep)

    assert result.namespace == "rlx"
    listed = sorted(w.identity.namespace for w in result.workers)
    assert listed == ["rlx-a", "rlx-b"]
    assert all(w.available for w in result.workers)

    # Our scope resolver agrees with the real listener on every namespace we started.
    scope = Scope.from_env(dep.frontend_env)
    assert scope.mode == "prefix" and scope.namespace == "rlx" and not scope.is_global
    for spec in specs:
        assert scope.matches(spec.namespace) == (spec.namespace in listed), spec.namespace


async def test_vllm_family_drives_real_routes_and_generation(dynamo_deployment):
    dep = dynamo_deployment([WorkerSpec("backend", model_name="tiny-policy")])
    worker = only(await discover(dep), "backend")
    pinned = GenerationCheck(
        model="tiny-policy",
        prompt_token_ids=PROMPT,
        max_tokens=3,
        backend_instance_id=worker.identity.instance_id,
        expected_model="tiny-policy",
    )

    async with make_client(timeout=ADMIN_TIMEOUT) as client:
        before = await run_generation_check(client, LOOPBACK, dep.frontend_url, pinned, timeout=30)
        assert before.ok, before.reason
        assert list(before.completion_token_ids) == policy_tokens(None, list(PROMPT), 3)

        version = await admin(client, worker, Operation.GET_WEIGHT_VERSION)
        assert version.ok and declared_version(version) == (None, False)

        # Refused while running: the paused check comes before anything else.
        early = await admin(
            client, worker, Operation.UPDATE_FROM_DISK, model_path="/ckpt/7", weight_version="p7"
        )
        assert not early.ok and early.http_status == 200
        assert "must be paused via pause_generation()" in early.error

        # Our adapter refuses a bad mode before sending; the real route refuses it too, and
        # call_admin surfaces the route's message from the HTTP 200 error body.
        with pytest.raises(ValueError):
            VLLM_WORKER.build(Operation.PAUSE, mode="bogus")
        raw_call = AdminCall(Operation.PAUSE, "POST", "engine/pause_generation", {"mode": "bogus"})
        bad_mode = await call_admin(
            client, LOOPBACK, worker.system_url, VLLM_WORKER, raw_call, timeout=ADMIN_TIMEOUT
        )
        assert not bad_mode.ok and bad_mode.http_status == 200
        assert bad_mode.error == "Invalid mode 'bogus'; expected keep|wait|abort"

        paused = await admin(client, worker, Operation.PAUSE, mode="keep")
        assert paused.ok, paused.error
        assert paused.body["message"] == "Engine paused" and paused.body["mode"] == "keep"

        update = await admin(
            client, worker, Operation.UPDATE_FROM_DISK, model_path="/ckpt/7", weight_version="p7"
        )
        assert update.ok, update.error
        assert update.body == {"status": "ok", "version": "p7", "version_declared": True}
        assert VLLM_WORKER.update_invalidates_cache(Operation.UPDATE_FROM_DISK)

        flushed = await admin(client, worker, Operation.FLUSH_CACHE)
        assert flushed.ok and flushed.body["message"] == "Cache flushed"

        readback = await admin(client, worker, Operation.GET_WEIGHT_VERSION)
        assert readback.ok and declared_version(readback) == ("p7", True)

        resumed = await admin(client, worker, Operation.RESUME)
        assert resumed.ok and resumed.body["message"] == "Engine resumed"
        alive = await admin(client, worker, Operation.LIVENESS)
        assert alive.ok and alive.body == {"status": "ok", "alive": True}

        after = await run_generation_check(client, LOOPBACK, dep.frontend_url, pinned, timeout=30)
        assert after.ok, after.reason
        assert list(after.completion_token_ids) == policy_tokens("p7", list(PROMPT), 3)
        assert after.completion_token_ids != before.completion_token_ids
        assert list(after.prompt_token_ids) == list(PROMPT)
        assert after.finish_reason == "length" and after.detailed_finish_reason == "length"
        choice = after.body["choices"][0]
        assert choice["logprobs"]["token_logprobs"] == [SYNTHETIC_LOGPROB] * 3

        # The fake engine saw the vLLM RPC with vLLM's kwarg name for reload_weights.
        state = httpx.post(f"{worker.system_url}/engine/interop/state", timeout=10).json()
        assert state["rpc_log"] == [["reload_weights", {"weights_path": "/ckpt/7"}]]
        assert state["paused"] is False

        # Pinning to an id the frontend does not know is a 400, which the verdict reports.
        stray = GenerationCheck(
            model="tiny-policy", prompt_token_ids=PROMPT, backend_instance_id=12345
        )
        verdict = await run_generation_check(client, LOOPBACK, dep.frontend_url, stray, timeout=30)
        assert not verdict.ok and verdict.http_status == 400


async def test_vllm_family_distributed_update_and_set_version(dynamo_deployment):
    dep = dynamo_deployment([WorkerSpec("backend")])
    worker = only(await discover(dep), "backend")

    async with make_client(timeout=ADMIN_TIMEOUT) as client:
        init = await admin(client, worker, Operation.INIT_WEIGHTS_GROUP, master_port=29500)
        assert init.ok and init.body["message"] == "Weight update group initialized"

        refused = await admin(
            client, worker, Operation.UPDATE_FROM_DISTRIBUTED, weight_version="d1", names=["w"]
        )
        assert not refused.ok and "must be paused" in refused.error

        assert (await admin(client, worker, Operation.PAUSE)).ok
        update = await admin(
            client, worker, Operation.UPDATE_FROM_DISTRIBUTED, weight_version="d1", names=["w"]
        )
        assert update.ok, update.error
        assert update.body == {"status": "ok", "version": "d1", "version_declared": True}

        destroyed = await admin(client, worker, Operation.DESTROY_WEIGHTS_GROUP)
        assert destroyed.ok and destroyed.body["message"] == "Weight update group destroyed"
        assert (await admin(client, worker, Operation.RESUME)).ok

        # set_weight_version needs no pause and stores any JSON value verbatim.
        declared = await admin(
            client, worker, Operation.SET_WEIGHT_VERSION, weight_version={"step": 8}
        )
        assert declared.ok and declared.body == {"status": "ok", "version": {"step": 8}}
        readback = await admin(client, worker, Operation.GET_WEIGHT_VERSION)
        assert declared_version(readback) == ({"step": 8}, True)

    state = httpx.post(f"{worker.system_url}/engine/interop/state", timeout=10).json()
    assert state["rpc_log"] == [
        ["init_broadcaster", {"master_port": 29500}],
        # Reserved keys stay with Dynamo; everything else is forwarded to the engine RPC.
        ["update_weights_from_path", {"names": ["w"]}],
        ["destroy_broadcaster", {}],
    ]


async def test_worker_lacking_update_route(dynamo_deployment):
    dep = dynamo_deployment([WorkerSpec("partial", omit_routes=("update_weights_from_disk",))])
    worker = only(await discover(dep), "partial")

    assert worker.available
    assert "update_weights_from_disk" not in worker.routes
    assert detect_family(worker.routes) is VLLM_WORKER
    assert not VLLM_WORKER.supports(Operation.UPDATE_FROM_DISK, worker.routes)
    assert VLLM_WORKER.supports(Operation.PAUSE, worker.routes)

    # Calling it anyway reaches the real system server's 404 for an unregistered route.
    async with make_client(timeout=ADMIN_TIMEOUT) as client:
        result = await admin(client, worker, Operation.UPDATE_FROM_DISK, model_path="/ckpt")
    assert not result.ok and result.http_status == 404
    assert result.body == {
        "error": "Route not found",
        "message": "Route /engine/update_weights_from_disk not found",
    }
