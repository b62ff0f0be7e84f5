"""The simulated OpenAI frontend, checked with the dynamo client's generation verdicts."""

from __future__ import annotations

import threading
import time

import httpx

from controlplane.dynamo.generation import GenerationCheck, run_generation_check
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.simfleet import Fault, FleetConfig, WorkerSpec, expected_completion_ids

POLICY = OutboundPolicy.from_cidrs(["127.0.0.0/8"])
PROMPT = (5, 6, 7, 8)


async def check(fleet, instance_id=None, max_tokens=4):
    request = GenerationCheck(
        model="sim-model",
        prompt_token_ids=PROMPT,
        max_tokens=max_tokens,
        backend_instance_id=instance_id,
        expected_model="sim-model",
    )
    async with make_client(timeout=10) as client:
        return await run_generation_check(client, POLICY, fleet.frontend_url, request, timeout=10)


def pinned_worker(fleet):
    worker = fleet.workers()[0]
    return worker["key"], worker["instance_id"]


async def test_pinned_generation_matches_version(simfleet):
    key, instance_id = pinned_worker(simfleet)
    simfleet.set_version(key, "v2")
    verdict = await check(simfleet, instance_id)
    assert verdict.ok, verdict.reason
    assert list(verdict.completion_token_ids) == expected_completion_ids("v2", PROMPT, 4)
    assert verdict.finish_reason == "length" and verdict.detailed_finish_reason == "length"
    other = simfleet.workers()[1]["instance_id"]
    assert list((await check(simfleet, other)).completion_token_ids) != list(
        verdict.completion_token_ids
    )


def test_raw_response_shape(simfleet):
    _, instance_id = pinned_worker(simfleet)
    body = {
        "model": "sim-model",
        "prompt": list(PROMPT),
        "max_tokens": 3,
        "logprobs": 1,
        "nvext": {
            "extra_fields": ["completion_token_ids", "prompt_token_ids", "worker_id", "bogus"],
            "backend_instance_id": instance_id,
        },
    }
    response = httpx.post(f"{simfleet.frontend_url}/v1/completions", json=body).json()
    (choice,) = response["choices"]
    assert "nvext" not in choice and response["id"].startswith("cmpl-")
    assert response["nvext"]["prompt_token_ids"] == list(PROMPT)
    assert response["nvext"]["worker_id"] == {
        "prefill_worker_id": instance_id,
        "decode_worker_id": instance_id,
    }
    assert set(choice["logprobs"]) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(choice["logprobs"]["token_logprobs"]) == 3
    assert response["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_frontend_errors(simfleet):
    url = f"{simfleet.frontend_url}/v1/completions"
    unknown = httpx.post(
        url, json={"model": "sim-model", "prompt": [1], "nvext": {"backend_instance_id": 1}}
    )
    assert unknown.status_code == 400
    assert unknown.json() == {"message": "Invalid request", "type": "Bad Request", "code": 400}
    many = httpx.post(
        url,
        json={
            "model": "sim-model",
            "prompt": [1],
            "n": 2,
            "nvext": {"extra_fields": ["completion_token_ids"]},
        },
    )
    assert many.status_code == 400 and many.json()["message"] == (
        'Validation: `nvext.extra_fields=["completion_token_ids"]` requires exactly one '
        "generated choice"
    )
    assert httpx.get(f"{simfleet.frontend_url}/v1/rl/workers").json() == {
        "message": "Route not found: GET /v1/rl/workers",
        "type": "Not Found",
        "code": 404,
    }
    assert httpx.get(f"{simfleet.frontend_url}/live").json() == {
        "status": "live",
        "message": "Service is live",
    }
    # Every registered endpoint instance, as 1.6.1 lists them: each vLLM worker's `generate`
    # and `rl` under its one instance id.
    health = httpx.get(f"{simfleet.frontend_url}/health").json()
    assert sorted(i["endpoint"] for i in health["instances"]) == ["generate"] * 4 + ["rl"] * 4
    for worker in simfleet.workers():
        ids = {
            i["instance_id"]
            for i in health["instances"]
            if i["component"] == worker["component"] and i["namespace"] == worker["namespace"]
        }
        assert worker["instance_id"] in ids


def test_pin_by_header_and_streaming(simfleet):
    key, instance_id = pinned_worker(simfleet)
    simfleet.set_version(key, 5)
    with httpx.stream(
        "POST",
        f"{simfleet.frontend_url}/v1/completions",
        headers={"x-dynamo-worker-instance-id": str(instance_id)},
        json={
            "model": "sim-model",
            "prompt": list(PROMPT),
            "max_tokens": 3,
            "stream": True,
            "nvext": {"extra_fields": ["completion_token_ids", "prompt_token_ids"]},
        },
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    import json

    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    ids = [i for c in chunks for i in c["nvext"]["completion_token_ids"]]
    assert ids == expected_completion_ids(5, PROMPT, 3)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["nvext"]["prompt_token_ids"] == list(PROMPT)


async def test_paused_vllm_generation_waits_for_resume(simfleet):
    key, instance_id = pinned_worker(simfleet)
    url = simfleet.state(key)["system_url"]
    httpx.post(f"{url}/engine/pause_generation", json={"mode": "keep"})
    threading.Timer(0.5, lambda: httpx.post(f"{url}/engine/resume_generation")).start()
    started = time.monotonic()
    verdict = await check(simfleet, instance_id)
    assert verdict.ok and time.monotonic() - started >= 0.45


async def test_paused_generation_is_bounded(simfleet_factory):
    fleet = simfleet_factory(FleetConfig(workers=[WorkerSpec()], paused_generation_max_wait=0.3))
    key, instance_id = pinned_worker(fleet)
    httpx.post(f"{fleet.state(key)['system_url']}/engine/pause_generation")
    verdict = await check(fleet, instance_id)
    assert not verdict.ok and verdict.http_status == 503


async def test_paused_sidecar_is_not_routable(simfleet_factory):
    fleet = simfleet_factory(
        FleetConfig(workers=[WorkerSpec(family="vllm-sidecar"), WorkerSpec(family="vllm-sidecar")])
    )
    paused, other = fleet.workers()
    httpx.post(f"{paused['system_url']}/engine/control/pause_generation", json={})
    assert (await check(fleet, paused["instance_id"])).http_status == 400
    for _ in range(4):  # unpinned requests all land on the routable worker
        verdict = await check(fleet)
        assert verdict.ok
        assert list(verdict.completion_token_ids) == expected_completion_ids("", PROMPT, 4)
    assert fleet.state(other["key"])["generation_count"] == 4


async def test_generation_faults(simfleet):
    key, instance_id = pinned_worker(simfleet)
    simfleet.inject(key, "generate", Fault.cancel(once=True))
    cancelled = await check(simfleet, instance_id)
    assert not cancelled.ok and cancelled.finish_reason == "stop"
    assert cancelled.detailed_finish_reason == "cancelled"
    simfleet.inject(key, "generate", Fault.wrong_tokens(once=True))
    wrong = await check(simfleet, instance_id)
    assert list(wrong.completion_token_ids) != expected_completion_ids(None, PROMPT, 4)
    simfleet.inject(key, "generate", Fault.http(500, "engine error", once=True))
    assert (await check(simfleet, instance_id)).http_status == 500
    simfleet.inject(key, "generate", Fault.drop(once=True))
    dropped = await check(simfleet, instance_id)
    assert not dropped.ok and "unreachable" in dropped.reason
    assert (await check(simfleet, instance_id)).ok


async def test_reverted_worker_answers_with_old_version(simfleet):
    key, instance_id = pinned_worker(simfleet)
    url = simfleet.state(key)["system_url"]
    simfleet.set_version(key, "v1")
    simfleet.inject(key, "resume_generation", Fault.revert_version())
    httpx.post(f"{url}/engine/pause_generation")
    httpx.post(
        f"{url}/engine/update_weights_from_disk", json={"model_path": "/c", "weight_version": "v2"}
    )
    httpx.post(f"{url}/engine/resume_generation")
    verdict = await check(simfleet, instance_id)
    assert list(verdict.completion_token_ids) == expected_completion_ids("v1", PROMPT, 4)


async def test_a_generation_never_lists_the_whole_fleets_models(simfleet, monkeypatch):
    """Every verify call asks whether its model is served: the answer stops at the first
    worker serving it instead of listing every worker's models (a pass over 10,000 workers per
    call). An unknown model still scans them all and is refused."""
    from controlplane.simfleet.fleet import SimFleet

    def listing(self):
        raise AssertionError("a generation listed every worker's models")

    monkeypatch.setattr(SimFleet, "models", listing)
    _, instance_id = pinned_worker(simfleet)
    for pin in (instance_id, None):
        verdict = await check(simfleet, pin)
        assert verdict.ok, verdict.reason
    async with httpx.AsyncClient() as client:
        unknown = await client.post(
            f"{simfleet.frontend_url}/v1/completions", json={"model": "nope", "prompt": [1]}
        )
    assert unknown.status_code == 404 and unknown.json()["message"] == "Model not found: nope"
