"""The simulated frontend's `/metrics`: Dynamo 1.6.1's names, labels, types and buckets, counting
the traffic it really served, errors included."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.simfleet import Fault, FleetConfig, WorkerSpec

HTTP = httpx.Client(timeout=10)
PROMPT = [5, 6, 7, 8]
#: As captured from the real 1.6.1 frontend (log-spaced, two significant figures).
TTFT_BUCKETS = [0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48,
                100, 220, 480]  # fmt: skip
DURATION_BUCKETS = [0, 2, 4, 8, 16, 32, 64, 130, 260, 510]


@pytest.fixture
def fleet(simfleet_factory):
    config = FleetConfig(
        workers=[WorkerSpec(namespace="rl-a", version="v1") for _ in range(2)],
        listener_env={"DYN_NAMESPACE": "rl-a"},
        seed=3,
    )
    return simfleet_factory(config)


def scrape(fleet) -> dict[str, dict[tuple, float]]:
    """Sample name → {sorted label items: value}, read by Prometheus's own parser."""
    reply = HTTP.get(f"{fleet.frontend_url}/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def types(fleet) -> dict[str, str]:
    text = HTTP.get(f"{fleet.frontend_url}/metrics").text
    return {
        line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")
    }


def requests_total(samples, **labels) -> float:
    want = {"endpoint": "completions", "model": "sim-model", "error_type": ""} | labels
    return samples.get("dynamo_frontend_requests_total", {}).get(tuple(sorted(want.items())), 0.0)


def post(fleet, instance_id=None, *, stream=False, model="sim-model", max_tokens=4):
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "stream": stream}
    if instance_id is not None:
        body["nvext"] = {"backend_instance_id": instance_id}
    reply = HTTP.post(f"{fleet.frontend_url}/v1/completions", json=body)
    reply.read()
    return reply


def test_counters_move_with_traffic_and_errors(fleet):
    (first, second) = [w["instance_id"] for w in fleet.workers()]
    idle = scrape(fleet)
    # As on the real frontend: no request series before the first request.
    assert "dynamo_frontend_requests_total" not in idle
    assert idle["dynamo_frontend_model_ready"] == {(("model", "sim-model"),): 1.0}

    for _ in range(3):
        assert post(fleet, first).status_code == 200
    for _ in range(2):
        assert post(fleet, second, stream=True).status_code == 200
    assert post(fleet, 12345).status_code == 400  # unknown pinned instance
    assert post(fleet, model="no-such-model").status_code == 404
    fleet.inject(fleet.workers()[1]["key"], "generate", Fault.engine_error(once=True))
    assert post(fleet, second).status_code == 500
    fleet.inject(fleet.workers()[0]["key"], "generate", Fault.http(503, once=True))
    assert post(fleet, first, stream=True).status_code == 503

    after = scrape(fleet)
    assert requests_total(after, request_type="unary", status="success") == 3
    assert requests_total(after, request_type="stream", status="success") == 2
    assert requests_total(after, request_type="unary", status="error", error_type="validation") == 1
    # An unknown model is counted under "unknown_model", not the name sent.
    assert (
        requests_total(
            after, model="unknown_model", request_type="unary", status="error",
            error_type="not_found",
        )
        == 1
    )  # fmt: skip
    assert requests_total(after, request_type="unary", status="error", error_type="internal") == 1
    assert requests_total(after, request_type="stream", status="error", error_type="overload") == 1
    assert after["dynamo_frontend_failures_total"] == {
        (("class", "InvalidRequest"), ("reason", "request.invalid")): 1.0,
        (("class", "NotFound"), ("reason", "request.not_found")): 1.0,
    }
    started = after["dynamo_frontend_requests_started_total"]
    assert sum(started.values()) == 9
    # Every success generated 4 tokens; failures none.
    assert after["dynamo_frontend_output_tokens_total"] == {(("model", "sim-model"),): 20.0}
    assert after["dynamo_frontend_inflight_requests"][(("model", "sim-model"),)] == 0
    assert after["dynamo_frontend_queued_requests"][(("model", "sim-model"),)] == 0
    # The request-duration histogram counts every request of the model, failures included.
    assert after["dynamo_frontend_request_duration_seconds_count"][(("model", "sim-model"),)] == 8
    kinds = types(fleet)
    assert kinds["dynamo_frontend_requests_total"] == "counter"
    assert kinds["dynamo_frontend_inflight_requests"] == "gauge"
    assert kinds["dynamo_frontend_time_to_first_token_seconds"] == "histogram"
    assert kinds["dynamo_frontend_request_duration_seconds"] == "histogram"


def buckets(samples, name: str, model: str = "sim-model") -> dict[float, float]:
    out = {}
    for labels, value in samples[f"{name}_bucket"].items():
        label = dict(labels)
        if label["model"] == model:
            out[float(label["le"])] = value
    return out


def test_histogram_buckets_are_dynamos_and_place_each_observation(fleet):
    slow_key, slow = fleet.workers()[1]["key"], fleet.workers()[1]["instance_id"]
    # Exactly 30 ms to the first token and 5 ms per token (sigma 0: no spread).
    fleet.set_latency(
        slow_key, {"ttft": {"median": 0.03, "sigma": 0}, "per_token": {"median": 0.005, "sigma": 0}}
    )
    for _ in range(3):
        assert post(fleet, slow, max_tokens=3).status_code == 200
    samples = scrape(fleet)
    ttft = buckets(samples, "dynamo_frontend_time_to_first_token_seconds")
    assert sorted(ttft) == [*TTFT_BUCKETS, float("inf")]
    # Each first token took at least 30 ms, so none is at or below the 22 ms bound.
    assert ttft[0.022] == 0 and ttft[float("inf")] == 3
    duration = buckets(samples, "dynamo_frontend_request_duration_seconds")
    assert sorted(duration) == [*DURATION_BUCKETS, float("inf")]
    assert duration[2.0] == 3  # well under 2 s: the real frontend's first bucket
    itl = buckets(samples, "dynamo_frontend_inter_token_latency_seconds")
    # Two gaps per 3-token request, each exactly 5 ms: in the 0.0035 < le <= 0.0067 bucket.
    assert sorted(itl)[:4] == [0, 0.0019, 0.0035, 0.0067]
    assert itl[0.0035] == 0 and itl[0.0067] == 6 and itl[float("inf")] == 6
    assert (
        samples["dynamo_frontend_time_to_first_token_seconds_sum"][(("model", "sim-model"),)]
        >= 3 * 0.03
    )
    # Per worker, as the real frontend has them: the last observation, by decimal id.
    worker = (("dp_rank", "none"), ("worker_id", str(slow)), ("worker_type", "decode"))
    last = samples["dynamo_frontend_worker_last_time_to_first_token_seconds"][worker]
    assert last >= 0.03
    assert samples["dynamo_frontend_worker_last_inter_token_latency_seconds"][worker] == 0.005
    assert samples["dynamo_frontend_worker_last_input_sequence_tokens"][worker] == len(PROMPT)


def test_inflight_counts_a_request_while_it_runs(fleet):
    key, instance_id = fleet.workers()[0]["key"], fleet.workers()[0]["instance_id"]
    fleet.inject(key, "generate", Fault.latency(1.5, once=True))
    worker = threading.Thread(target=post, args=(fleet, instance_id))
    worker.start()
    deadline = time.monotonic() + 5
    seen = 0.0
    while time.monotonic() < deadline and not seen:
        seen = (
            scrape(fleet)
            .get("dynamo_frontend_inflight_requests", {})
            .get((("model", "sim-model"),), 0.0)
        )
    worker.join(10)
    assert seen == 1
    assert scrape(fleet)["dynamo_frontend_inflight_requests"][(("model", "sim-model"),)] == 0


def test_a_worker_that_starts_failing_later_is_counted_from_then_on(fleet):
    key, instance_id = fleet.workers()[0]["key"], fleet.workers()[0]["instance_id"]
    fleet.inject(key, "generate", Fault.engine_error("engine died", after=1.5))
    armed_at = time.monotonic()
    assert post(fleet, instance_id).status_code == 200  # healthy until T
    assert time.monotonic() - armed_at < 1.5, "the first request must run before T"
    deadline = time.monotonic() + 5
    sent = 1
    while time.monotonic() < deadline:
        reply = post(fleet, instance_id)
        sent += 1
        if reply.status_code != 200:
            break
    assert reply.status_code == 500 and reply.json() == {
        "message": "engine died",
        "type": "Internal Server Error",
        "code": 500,
    }
    assert time.monotonic() - armed_at >= 1.5
    # From then on every request fails, and the other worker is untouched.
    assert post(fleet, instance_id).status_code == 500
    sent += 1
    assert post(fleet, fleet.workers()[1]["instance_id"]).status_code == 200
    samples = scrape(fleet)
    assert requests_total(samples, request_type="unary", status="error", error_type="internal") == 2
    # The failing worker's own system server counts them, by hex instance id, as 1.6.1 does;
    # the frontend has no per-worker error counter.
    system_url = fleet.state(key)["system_url"]
    page: dict[str, list] = {}
    for family in text_string_to_metric_families(HTTP.get(f"{system_url}/metrics").text):
        for sample in family.samples:
            page.setdefault(sample.name, []).append((sample.labels, sample.value))
    ((labels, errors),) = page["dynamo_component_errors_total"]
    assert errors == 2 and labels["worker_id"] == f"{instance_id:x}"
    assert labels["dynamo_endpoint"] == "generate" and labels["error_type"] == "generate"
    assert page["dynamo_component_requests_total"][0][1] == sent
    assert page["dynamo_component_inflight_requests"][0][1] == 0
    assert page["dynamo_component_request_duration_seconds_count"][0][1] == sent
    bounds = [
        float(lab["le"]) for lab, _ in page["dynamo_component_request_duration_seconds_bucket"]
    ]
    assert bounds[:3] == [0.005, 0.01, 0.025] and bounds[-1] == float("inf")
    # The healthy worker has no error series at all, as on 1.6.1.
    other = fleet.state(fleet.workers()[1]["key"])["system_url"]
    assert "dynamo_component_errors_total{" not in HTTP.get(f"{other}/metrics").text
    # The worker's state lists the fault with its delay.
    faults = fleet.state(key)["faults"]["generate"]
    assert faults[0]["kind"] == "engine_error" and faults[0]["after"] == 1.5


def test_a_client_that_leaves_mid_stream_is_counted_as_cancelled(fleet):
    key, instance_id = fleet.workers()[0]["key"], fleet.workers()[0]["instance_id"]
    fleet.set_latency(key, {"ttft": {"median": 0}, "per_token": {"median": 0.2, "sigma": 0}})
    body = {
        "model": "sim-model",
        "prompt": PROMPT,
        "max_tokens": 20,
        "stream": True,
        "nvext": {"backend_instance_id": instance_id},
    }
    url = f"{fleet.frontend_url}/v1/completions"
    # Leaving the block closes the connection after the first of 20 events.
    with httpx.Client(timeout=10) as client, client.stream("POST", url, json=body) as reply:
        assert next(reply.iter_lines()).startswith("data: {")
    deadline = time.monotonic() + 10
    cancelled = 0.0
    while time.monotonic() < deadline and not cancelled:
        samples = scrape(fleet)
        cancelled = requests_total(
            samples, request_type="stream", status="error", error_type="cancelled"
        )
    assert cancelled == 1
    assert samples["dynamo_frontend_disconnected_clients"] == {(): 1.0}
    assert samples["dynamo_frontend_inflight_requests"][(("model", "sim-model"),)] == 0
