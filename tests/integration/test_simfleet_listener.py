"""The simulated RL listener, read through the real `controlplane.dynamo` discovery client."""

from __future__ import annotations

import time

import httpx
import pytest

from controlplane.dynamo.discovery import fetch_discovery
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.simfleet import (
    SIDECAR_ROUTES,
    VLLM_RL_ROUTES,
    Fault,
    FleetConfig,
    WorkerSpec,
)

POLICY = OutboundPolicy.from_cidrs(["127.0.0.0/8"])


async def discover(listener_url: str, timeout: float = 20.0):
    async with make_client(timeout=timeout) as client:
        return await fetch_discovery(client, POLICY, listener_url, timeout=timeout)


def raw_workers(listener_url: str) -> dict:
    return httpx.get(f"{listener_url}/v1/rl/workers", timeout=20).json()


def key_of(entry) -> str:
    return entry["system_url"].rsplit("/", 1)[-1]


async def test_listener_shape_parsed_by_client(simfleet):
    result = await discover(simfleet.listener_url)
    assert result.protocol_version == 1
    assert result.namespace == "rl"
    assert result.rejected == ()
    assert len(result.workers) == 4
    for worker in result.workers:
        assert worker.routes == tuple(sorted(VLLM_RL_ROUTES))
        assert worker.system_url.startswith(simfleet.admin_url + "/w/")
        assert worker.model == "sim-model"
        assert worker.world_size == 1
        assert worker.admin_base_url is None
        assert worker.error is None
        ns, comp = worker.identity.namespace, worker.identity.component
        assert worker.request_plane_url == f"dyn://{ns}.{comp}.rl"
        assert list(worker.transport) == ["tcp"]
        assert worker.transport["tcp"].endswith(f"/{ns}/{comp}/rl")
    keys = [
        (w.identity.namespace, w.identity.component, w.identity.endpoint, w.identity.instance_id)
        for w in result.workers
    ]
    assert keys == sorted(keys)


def test_raw_json_omits_absent_fields_and_keeps_u64_exact(simfleet_factory):
    big = 2**64 - 5
    fleet = simfleet_factory(
        FleetConfig(
            workers=[
                WorkerSpec(instance_id=big, model=None, world_size=None),
                WorkerSpec(instance_id=7, system_server=False),
            ]
        )
    )
    body = httpx.get(f"{fleet.listener_url}/v1/rl/workers").text
    assert str(big) in body and "null" not in body
    entries = raw_workers(fleet.listener_url)["workers"]
    assert [e["instance_id"] for e in entries] == [7, big]
    assert "system_url" not in entries[0] and entries[0]["model"] == "sim-model"
    assert "model" not in entries[1] and "world_size" not in entries[1]
    assert raw_workers(fleet.listener_url)["namespace"] == "dynamo"


def test_random_instance_ids_exceed_2_63(simfleet_factory):
    fleet = simfleet_factory(FleetConfig.generate(workers=40, seed=7))
    ids = [e["instance_id"] for e in raw_workers(fleet.listener_url)["workers"]]
    assert len(set(ids)) == 40 and any(i > 2**63 for i in ids)


def test_methods_and_paths(simfleet):
    url = simfleet.listener_url
    response = httpx.post(f"{url}/v1/rl/workers")
    assert response.status_code == 405 and response.content == b""
    assert httpx.get(f"{url}/health").status_code == 404
    assert httpx.get(f"{url}/v1/rl/workers/").status_code == 404


NAMESPACES = ["dynamo", "Dynamo", "dynamo-x", "dynamoz", "prod", "prod-a", "prod-a-gen2", "prodx"]


@pytest.mark.parametrize(
    ("env", "reported", "matched"),
    [
        ({}, "dynamo", {"dynamo"}),
        ({"DYN_NAMESPACE_PREFIX": "prod"}, "prod", {"prod", "prod-a", "prod-a-gen2"}),
        ({"DYN_NAMESPACE_PREFIX": "prod-a"}, "prod-a", {"prod-a", "prod-a-gen2"}),
        ({"DYN_NAMESPACE_PREFIX": "prod-"}, "prod-", set()),
        ({"DYN_NAMESPACE_PREFIX": "dyn"}, "dyn", set()),
        (
            {"DYN_NAMESPACE_PREFIX": "dynamo", "DYN_NAMESPACE": "prod"},
            "dynamo",
            set(NAMESPACES),
        ),
        ({"DYN_NAMESPACE_PREFIX": "", "DYN_NAMESPACE": "prod"}, "prod", {"prod"}),
        ({"DYN_NAMESPACE": "prod", "DYN_NAMESPACE_WORKER_SUFFIX": "a"}, "prod-a", {"prod-a"}),
        ({"DYN_NAMESPACE": "prod-a", "DYN_NAMESPACE_WORKER_SUFFIX": "a"}, "prod-a-a", set()),
        ({"DYN_NAMESPACE_WORKER_SUFFIX": "x"}, "dynamo-x", {"dynamo-x"}),
    ],
)
def test_scope_rules(simfleet_factory, env, reported, matched):
    fleet = simfleet_factory(
        FleetConfig(workers=[WorkerSpec(namespace=ns) for ns in NAMESPACES], listener_env=env)
    )
    payload = raw_workers(fleet.listener_url)
    assert payload["namespace"] == reported
    assert {e["namespace"] for e in payload["workers"]} == matched


def test_component_and_endpoint_filters_and_families(simfleet_factory):
    fleet = simfleet_factory(
        FleetConfig(
            workers=[
                WorkerSpec(component="good"),
                WorkerSpec(component="err"),
                WorkerSpec(component="other"),
                WorkerSpec(component="good", family="sglang"),
                WorkerSpec(component="good", family="vllm-sidecar", rl_endpoint="admin"),
            ],
            listener_env={"DYN_RL_COMPONENTS": " good , err ,, ", "DYN_RL_COMPONENT": "other"},
        )
    )
    entries = raw_workers(fleet.listener_url)["workers"]
    assert sorted(e["component"] for e in entries) == ["err", "good"]  # sglang never listed
    fleet2 = simfleet_factory(
        FleetConfig(
            workers=[
                WorkerSpec(
                    family="vllm-sidecar",
                    rl_endpoint="admin",
                    world_size=2,
                    admin_base_url="http://127.0.0.1:9/",
                ),
                WorkerSpec(rl_endpoint="admin"),  # Python workers ignore DYN_RL_ENDPOINT
            ],
            listener_env={"DYN_RL_ENDPOINT": "admin"},
        )
    )
    (sidecar,) = raw_workers(fleet2.listener_url)["workers"]
    assert sidecar["endpoint"] == "admin"
    assert sidecar["routes"] == sorted(SIDECAR_ROUTES)
    assert sidecar["admin_base_url"] == "http://127.0.0.1:9/"
    assert sidecar["world_size"] == 2


async def test_probe_error_fault_keeps_model_drops_admin_fields(simfleet):
    victim = raw_workers(simfleet.listener_url)["workers"][1]
    simfleet.inject(key_of(victim), "probe", Fault.probe_error("engine is dead", once=True))
    result = await discover(simfleet.listener_url)
    broken = [w for w in result.workers if w.error]
    assert len(broken) == 1
    (worker,) = broken
    assert worker.identity.instance_id == victim["instance_id"]
    assert worker.error == "engine is dead" and worker.routes == ()
    assert worker.system_url is None and worker.world_size is None
    assert worker.model == "sim-model" and not worker.available
    # One-shot: the next refresh is healthy again.
    assert all(w.error is None for w in (await discover(simfleet.listener_url)).workers)


def test_hung_probe_delays_response_until_timeout(simfleet):
    victim = raw_workers(simfleet.listener_url)["workers"][0]
    simfleet.inject(key_of(victim), "probe", Fault.hang(30))
    started = time.monotonic()
    entries = raw_workers(simfleet.listener_url)["workers"]
    elapsed = time.monotonic() - started
    assert 1.9 < elapsed < 5
    errors = {e["instance_id"]: e.get("error") for e in entries}
    assert errors[victim["instance_id"]] == "worker discovery timed out after 2s"
    assert sum(1 for e in errors.values() if e) == 1


def test_one_probe_permit_starves_healthy_workers(simfleet_factory):
    fleet = simfleet_factory(
        FleetConfig.generate(
            workers=3,
            listener_env={"DYN_RL_REQUEST_TIMEOUT_SECS": "1", "DYN_RL_MAX_CONCURRENT_PROBES": "1"},
        )
    )
    # The first-started worker takes the only permit first; the healthy ones queue behind it.
    fleet.inject(fleet.workers()[0]["key"], "probe", Fault.hang(30))
    entries = raw_workers(fleet.listener_url)["workers"]
    assert all(e.get("error") == "worker discovery timed out after 1s" for e in entries)


def test_timeout_zero_and_unparsable(simfleet_factory):
    zero = simfleet_factory(
        FleetConfig.generate(workers=2, listener_env={"DYN_RL_REQUEST_TIMEOUT_SECS": "0"})
    )
    entries = raw_workers(zero.listener_url)["workers"]
    assert [e["error"] for e in entries] == ["worker discovery timed out after 0s"] * 2
    bad = simfleet_factory(
        FleetConfig.generate(workers=1, listener_env={"DYN_RL_REQUEST_TIMEOUT_SECS": "-3"})
    )
    (entry,) = raw_workers(bad.listener_url)["workers"]
    bad.inject(key_of(entry), "probe", Fault.latency(0.1, once=True))
    assert "error" not in raw_workers(bad.listener_url)["workers"][0]


@pytest.mark.parametrize(
    ("descriptor", "error"),
    [
        ({"status": "error"}, "worker routes request failed"),
        ({"status": "ERROR", "routes": ["r"]}, None),
        ({"routes": "r"}, "worker routes response missing 'routes' array"),
        ({"routes": [1]}, "worker routes response contains a non-string route entry"),
        ({"routes": [""]}, "worker routes response contains an empty route entry"),
        (
            {"routes": ["r"], "admin_base_url": 42},
            "worker routes response has invalid 'admin_base_url'",
        ),
        (
            {"routes": ["r"], "admin_base_url": "http://u@h/", "world_size": 1},
            "worker routes response has invalid 'admin_base_url': "
            "RL admin base URL must not include user information",
        ),
        ({"routes": ["r"], "world_size": "2"}, "worker routes response has invalid 'world_size'"),
        ({"routes": ["r"], "world_size": 2.0}, "worker routes response has invalid 'world_size'"),
        ({"routes": ["r"], "world_size": 2**32}, "worker routes response has invalid 'world_size'"),
        (
            {"routes": ["r"], "admin_base_url": "http://h/"},
            "worker routes response has 'admin_base_url' without valid 'world_size'",
        ),
    ],
)
def test_descriptor_validation_strings(simfleet_factory, descriptor, error):
    fleet = simfleet_factory(FleetConfig.generate(workers=1))
    (entry,) = raw_workers(fleet.listener_url)["workers"]
    fleet.inject(key_of(entry), "probe", Fault.reply(descriptor))
    (entry,) = raw_workers(fleet.listener_url)["workers"]
    assert entry.get("error") == error
    if error:
        assert entry["routes"] == [] and "system_url" not in entry


def test_probe_http_error_drop_and_missing(simfleet):
    entries = raw_workers(simfleet.listener_url)["workers"]
    simfleet.inject(key_of(entries[0]), "probe", Fault.http(500, "kaboom"))
    simfleet.inject(key_of(entries[1]), "probe", Fault.drop())
    simfleet.inject(key_of(entries[2]), "probe", Fault.missing())
    listed = {
        e["instance_id"]: e.get("error") for e in raw_workers(simfleet.listener_url)["workers"]
    }
    assert listed[entries[0]["instance_id"]] == "Internal: RuntimeError: kaboom"
    assert listed[entries[1]["instance_id"]] == "empty routes response from worker"
    assert entries[2]["instance_id"] not in listed
    simfleet.clear_faults()
    assert len(raw_workers(simfleet.listener_url)["workers"]) == 4


async def test_membership_join_and_leave(simfleet):
    before = await discover(simfleet.listener_url)
    new_key = simfleet.add_worker({"namespace": "rl-c"})
    gone = before.workers[0]
    simfleet.remove_worker(gone.identity.instance_id)
    after = await discover(simfleet.listener_url)
    ids = {w.identity.instance_id for w in after.workers}
    assert simfleet.state(new_key)["instance_id"] in ids
    assert gone.identity.instance_id not in ids and len(ids) == 4
    # The departed worker's system server no longer answers.
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{gone.system_url}/health")
