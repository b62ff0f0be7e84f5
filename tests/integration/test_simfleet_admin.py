"""vLLM Python worker system servers and admin-route faults, driven through the dynamo client."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from controlplane.dynamo.admin import call_admin
from controlplane.dynamo.families import VLLM_WORKER, Operation, detect_family
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.simfleet import Fault, FleetConfig, WorkerSpec

POLICY = OutboundPolicy.from_cidrs(["127.0.0.0/8"])


async def run_op(system_url, op, family=VLLM_WORKER, timeout=5.0, **params):
    """Run one operation's calls in order, stopping at the first failure; the last result."""
    async with make_client(timeout=timeout) as client:
        result = None
        for call in family.build(op, **params):
            result = await call_admin(client, POLICY, system_url, family, call, timeout=timeout)
            if not result.ok:
                break
        return result


def first_worker(fleet):
    entry = httpx.get(f"{fleet.listener_url}/v1/rl/workers").json()["workers"][0]
    return entry["system_url"].rsplit("/", 1)[-1], entry["system_url"], entry


async def test_gated_disk_update_sequence(simfleet):
    key, url, entry = first_worker(simfleet)
    assert detect_family(entry["routes"]) is VLLM_WORKER
    refused = await run_op(url, Operation.UPDATE_FROM_DISK, model_path="/ckpt", weight_version="v2")
    assert not refused.ok and "must be paused" in refused.error
    assert (await run_op(url, Operation.GET_WEIGHT_VERSION)).body == {
        "status": "ok",
        "version": None,
        "version_declared": False,
    }
    assert (await run_op(url, Operation.PAUSE, mode="wait")).ok
    update = await run_op(url, Operation.UPDATE_FROM_DISK, model_path="/ckpt", weight_version="v2")
    assert update.ok and update.body == {"status": "ok", "version": "v2", "version_declared": True}
    assert (await run_op(url, Operation.FLUSH_CACHE)).ok
    version = await run_op(url, Operation.GET_WEIGHT_VERSION)
    assert version.body == {"status": "ok", "version": "v2", "version_declared": True}
    assert (await run_op(url, Operation.RESUME)).ok
    assert (await run_op(url, Operation.LIVENESS)).body == {"status": "ok", "alive": True}
    state = simfleet.state(key)
    assert state["flush_count"] == 1 and state["version"] == "v2" and not state["paused"]
    assert [c["route"] for c in state["calls"]][-4:] == [
        "flush_cache",
        "get_weight_version",
        "resume_generation",
        "liveness_probe",
    ]


async def test_update_without_version_reports_unknown_and_keeps_old(simfleet):
    key, url, _ = first_worker(simfleet)
    simfleet.set_version(key, "v1")
    await run_op(url, Operation.PAUSE)
    reply = await run_op(url, Operation.UPDATE_FROM_DISK, model_path="/ckpt")
    assert reply.body == {"status": "ok", "version": "unknown", "version_declared": False}
    assert simfleet.state(key)["version"] == "v1"


async def test_distributed_path_and_errors(simfleet):
    _, url, _ = first_worker(simfleet)
    broken = await run_op(url, Operation.INIT_WEIGHTS_GROUP, master_address="h")
    assert broken.data["message"] == "invalid group arguments: 'master_port'"
    group = {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 2}
    assert (await run_op(url, Operation.INIT_WEIGHTS_GROUP, **group)).ok
    await run_op(url, Operation.PAUSE)
    early = await run_op(url, Operation.UPDATE_FROM_DISTRIBUTED, weight_version=3, names=["w"])
    assert early.data["message"] == "no weights were broadcast to the weight update group"
    assert simfleet.broadcast(3) == 1
    update = await run_op(url, Operation.UPDATE_FROM_DISTRIBUTED, weight_version=3, names=["w"])
    assert update.ok and update.body["version"] == 3
    assert (await run_op(url, Operation.DESTROY_WEIGHTS_GROUP)).ok
    set_version = await run_op(url, Operation.SET_WEIGHT_VERSION, weight_version="v9")
    assert set_version.body == {"status": "ok", "version": "v9"}
    tensor = httpx.post(f"{url}/engine/update_weights_from_tensor", json={}).json()
    assert tensor == {"status": "error", "message": "update_weights_from_tensor is not implemented"}
    unpaused = httpx.post(
        f"{url}/engine/update_weights_from_distributed", json={"allow_unpaused": "yes"}
    ).json()
    assert unpaused["message"] == "'allow_unpaused' must be a boolean"


def test_generic_system_server_http(simfleet):
    _, url, _ = first_worker(simfleet)
    for method in ("GET", "PUT", "DELETE", "HEAD"):
        assert httpx.request(method, f"{url}/engine/liveness_probe").status_code == 200
    response = httpx.post(f"{url}/engine/flush_cache?x=1", content=b"null")
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.json() == {"status": "ok", "message": "Cache flushed"}
    assert httpx.post(f"{url}/engine/flush_cache", json=[1, 2]).json() == {
        "status": "error",
        "message": "request body must be a JSON object",
    }
    invalid = httpx.post(f"{url}/engine/flush_cache", content=b"nope")
    assert invalid.status_code == 400 and invalid.json() == {
        "error": "Invalid JSON",
        "message": "expected ident at line 1 column 2",
    }
    missing = httpx.post(f"{url}/engine/nope")
    assert missing.status_code == 404
    assert missing.json() == {"error": "Route not found", "message": "Route /engine/nope not found"}
    for path in ("/engine", "/engine/", "/engine/flush_cache/", "/"):
        assert httpx.post(f"{url}{path}").status_code == 404
    bad_mode = httpx.post(f"{url}/engine/pause_generation", json={"mode": "x"}).json()
    assert bad_mode["message"] == "Invalid mode 'x'; expected keep|wait|abort"
    assert httpx.post(f"{url}/engine/abort_request", json={}).json()["message"] == (
        "Missing 'request_id' in body"
    )
    health = httpx.get(f"{url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert set(health.json()["uptime"]) == {"secs", "nanos"}
    assert httpx.get(f"{url}/live").json()["status"] == "ready"


def test_notready_health(simfleet_factory):
    fleet = simfleet_factory(FleetConfig(workers=[WorkerSpec(health="notready")]))
    _, url, _ = first_worker(fleet)
    assert httpx.get(f"{url}/health").status_code == 503


async def test_fault_latency(simfleet):
    key, url, _ = first_worker(simfleet)
    simfleet.inject(key, "liveness_probe", Fault.latency(0.4, once=True))
    slow = await run_op(url, Operation.LIVENESS)
    assert slow.ok and slow.duration_ms >= 380
    fast = await run_op(url, Operation.LIVENESS)
    assert fast.ok and fast.duration_ms < 380


async def test_fault_error_body_and_http_5xx(simfleet):
    key, url, _ = first_worker(simfleet)
    simfleet.inject(key, "pause_generation", Fault.error("engine exploded", once=True))
    failed = await run_op(url, Operation.PAUSE)
    assert failed.http_status == 200 and not failed.ok and "engine exploded" in failed.error
    simfleet.inject(key, "pause_generation", Fault.http(503, "overloaded", once=True))
    failed = await run_op(url, Operation.PAUSE)
    assert failed.http_status == 503 and not failed.ok
    assert failed.body == {"error": "Handler error", "message": "overloaded"}
    assert (await run_op(url, Operation.PAUSE)).ok  # both were one-shot


async def test_fault_hang_times_out_client(simfleet):
    key, url, _ = first_worker(simfleet)
    simfleet.inject(key, "resume_generation", Fault.hang(30))
    started = time.monotonic()
    result = await run_op(url, Operation.RESUME, timeout=0.5)
    assert not result.ok and "timed out" in result.error
    assert time.monotonic() - started < 3


async def test_fault_drop_connection(simfleet):
    key, url, _ = first_worker(simfleet)
    simfleet.inject(key, "flush_cache", Fault.drop(once=True))
    result = await run_op(url, Operation.FLUSH_CACHE)
    assert not result.ok and result.http_status is None
    assert "connection dropped" in result.error
    assert simfleet.state(key)["flush_count"] == 0
    assert (await run_op(url, Operation.FLUSH_CACHE)).ok


async def test_fault_missing_route(simfleet):
    key, url, _ = first_worker(simfleet)
    simfleet.inject(key, "get_weight_version", Fault.missing())
    result = await run_op(url, Operation.GET_WEIGHT_VERSION)
    assert result.http_status == 404 and not result.ok
    assert result.body["message"] == "Route /engine/get_weight_version not found"


async def test_fault_crash_removes_worker(simfleet):
    key, url, entry = first_worker(simfleet)
    simfleet.inject(key, "pause_generation", Fault.crash())
    result = await run_op(url, Operation.PAUSE)
    assert not result.ok and "connection dropped" in result.error
    ids = [
        e["instance_id"]
        for e in httpx.get(f"{simfleet.listener_url}/v1/rl/workers").json()["workers"]
    ]
    assert entry["instance_id"] not in ids and len(ids) == 3


async def test_init_group_watchdog_kills_worker(simfleet_factory):
    fleet = simfleet_factory(FleetConfig(workers=[WorkerSpec(init_weights_timeout=0.3)]))
    key, url, _ = first_worker(fleet)
    fleet.inject(key, "init_weights_update_group", Fault.hang(10))
    result = await run_op(url, Operation.INIT_WEIGHTS_GROUP)
    assert not result.ok and "connection dropped" in result.error
    assert fleet.workers() == []


async def test_a_group_missing_a_rank_never_forms_and_the_watchdog_kills_its_member(
    simfleet_factory,
):
    fleet = simfleet_factory(FleetConfig(workers=[WorkerSpec(init_weights_timeout=0.3)]))
    _, url, _ = first_worker(fleet)
    # Rank 2 of 3 never joins: the collective cannot form, the member's watchdog expires.
    group = {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 3}
    result = await run_op(url, Operation.INIT_WEIGHTS_GROUP, **group)
    assert not result.ok and "connection dropped" in result.error
    assert fleet.workers() == [] and fleet.groups() == []
    assert fleet.events()[-1]["event"] == "crash"


async def test_a_rank_taken_twice_is_refused(simfleet_factory):
    fleet = simfleet_factory(FleetConfig(workers=[WorkerSpec(), WorkerSpec()]))
    urls = [w["system_url"] for w in fleet.workers()]
    group = {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 3}
    first = asyncio.ensure_future(run_op(urls[0], Operation.INIT_WEIGHTS_GROUP, **group))
    await asyncio.sleep(0.2)
    second = await run_op(urls[1], Operation.INIT_WEIGHTS_GROUP, **group)
    assert second.data["message"] == "rank 1 is already held in group 'weight_update_group'"
    # The right rank lets the group form, and both joins answer.
    third = await run_op(urls[1], Operation.INIT_WEIGHTS_GROUP, **{**group, "rank_offset": 2})
    assert third.ok and (await first).ok
    (formed,) = fleet.groups()
    assert formed["formed"] and formed["ranks"] == {
        "0": "trainer",
        "1": urls[0].rsplit("/", 1)[-1],
        "2": urls[1].rsplit("/", 1)[-1],
    }


async def test_fault_silent_version_revert(simfleet):
    key, url, _ = first_worker(simfleet)
    simfleet.set_version(key, "v1")
    simfleet.inject(key, "resume_generation", Fault.revert_version())
    await run_op(url, Operation.PAUSE)
    await run_op(url, Operation.UPDATE_FROM_DISK, model_path="/ckpt", weight_version="v2")
    assert (await run_op(url, Operation.GET_WEIGHT_VERSION)).body["version"] == "v2"
    assert (await run_op(url, Operation.RESUME)).ok
    reverted = await run_op(url, Operation.GET_WEIGHT_VERSION)
    assert reverted.ok and reverted.body["version"] == "v1"


async def test_wildcard_fault_and_clear(simfleet):
    key, url, _ = first_worker(simfleet)
    simfleet.inject(key, "*", Fault.error("all broken"))
    assert not (await run_op(url, Operation.LIVENESS)).ok
    assert not (await run_op(url, Operation.FLUSH_CACHE)).ok
    simfleet.clear_faults(key)
    assert (await run_op(url, Operation.LIVENESS)).ok


@pytest.mark.parametrize("kind", ["http_error", "drop"])
def test_health_faults(simfleet, kind):
    key, url, _ = first_worker(simfleet)
    simfleet.inject(key, "health", {"kind": kind, "status": 503, "once": True})
    if kind == "drop":
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"{url}/health")
    else:
        assert httpx.get(f"{url}/health").status_code == 503
    assert httpx.get(f"{url}/health").status_code == 200
