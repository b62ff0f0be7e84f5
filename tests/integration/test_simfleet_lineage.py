"""The simulated policy lineage, seen through the simulated frontend the way a canary judge
sees it: pinned, greedy completions and teacher-forced prompt logprobs per worker."""

from __future__ import annotations

import itertools
import json
import statistics
import time

import httpx
import pytest

from controlplane.simfleet import FleetConfig, SimFleetControl, SimFleetError, WorkerSpec
from controlplane.simfleet.cli import add_arguments, build_config
from controlplane.simfleet.lineage import MIN_FINITE_LOGPROB

PROMPTS = [[5 + i, 40 + 3 * i, 7, 300 + i, 11] for i in range(12)]
#: One client for the module: building one per request (an SSL context each) costs ~0.1 s.
HTTP = httpx.Client(timeout=10)
EXTRA = ["completion_token_ids", "prompt_token_ids", "detailed_finish_reason", "worker_id"]


@pytest.fixture
def fleet(simfleet_factory):
    """Two workers serving the same lineage; tests move each one to the version they need."""
    config = FleetConfig(
        workers=[WorkerSpec(namespace="rl-a", version="v10") for _ in range(2)],
        listener_env={"DYN_NAMESPACE": "rl-a"},
        seed=7,
        lineage={"seed": 11},
    )
    return simfleet_factory(config)


def ids_of(fleet) -> list[int]:
    return [w["instance_id"] for w in fleet.workers()]


def complete(fleet, instance_id, prompt, *, max_tokens=8, prompt_logprobs=None, **extra):
    body = {
        "model": "sim-model",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 0,
        "nvext": {
            "backend_instance_id": instance_id,
            "extra_fields": EXTRA + (["prompt_logprobs"] if prompt_logprobs is not None else []),
        },
        **extra,
    }
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    reply = HTTP.post(f"{fleet.frontend_url}/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def teacher_forced(fleet, instance_id, prompt, continuation):
    """The logprob of each continuation token after the prompt, under that worker's weights."""
    reply = complete(fleet, instance_id, prompt + continuation, max_tokens=1, prompt_logprobs=0)
    entries = reply["nvext"]["prompt_logprobs"]
    assert len(entries) == len(prompt + continuation) and entries[0] is None
    return [entries[len(prompt) + i][str(t)]["logprob"] for i, t in enumerate(continuation)]


def mean_abs_shift(fleet, baseline_version, canary_version) -> float:
    """What a judge computes: the canary's teacher-forced logprobs of the baseline's own
    greedy continuation, against the baseline's."""
    base, canary = ids_of(fleet)
    keys = [w["key"] for w in fleet.workers()]
    fleet.set_version(keys[0], baseline_version)
    fleet.set_version(keys[1], canary_version)
    shifts = []
    for prompt in PROMPTS:
        continuation = complete(fleet, base, prompt)["nvext"]["completion_token_ids"]
        before = teacher_forced(fleet, base, prompt, continuation)
        after = teacher_forced(fleet, canary, prompt, continuation)
        shifts.extend(abs(a - b) for a, b in zip(after, before, strict=True))
    return statistics.mean(shifts)


def test_a_close_successor_drifts_little_a_far_one_more_and_marginal_and_drift_most(fleet):
    fleet.set_broken("v30", "marginal")
    fleet.set_broken("v31", "drift")
    same = mean_abs_shift(fleet, "v10", "v10")
    close = mean_abs_shift(fleet, "v10", "v11")
    far = mean_abs_shift(fleet, "v10", "v60")
    marginal = mean_abs_shift(fleet, "v10", "v30")
    drift = mean_abs_shift(fleet, "v10", "v31")
    assert same == 0.0
    # One step: a realistic RL update, well under a tenth of a nat per token.
    assert 0 < close < 0.02
    assert close < far < marginal < drift
    # The presets sit apart by clear factors, so a judge's thresholds can separate them.
    assert marginal > 5 * close and drift > 5 * marginal and drift > 1.0


def test_drift_changes_the_greedy_tokens_and_a_close_successor_mostly_keeps_them(fleet):
    fleet.set_broken("v11", "drift")
    base_id, canary_id = ids_of(fleet)
    canary_key = fleet.workers()[1]["key"]
    fleet.set_version(canary_key, "v11")
    changed = total = 0
    for prompt in PROMPTS:
        base = complete(fleet, base_id, prompt)["nvext"]["completion_token_ids"]
        drifted = complete(fleet, canary_id, prompt)["nvext"]["completion_token_ids"]
        changed += base[0] != drifted[0]
        total += 1
    assert changed / total > 0.8
    fleet.set_broken("v11", None)
    agree = sum(
        complete(fleet, base_id, p)["nvext"]["completion_token_ids"][0]
        == complete(fleet, canary_id, p)["nvext"]["completion_token_ids"][0]
        for p in PROMPTS
    )
    assert agree / len(PROMPTS) > 0.8


def test_garbage_repeats_itself(fleet):
    fleet.set_broken("v12", "garbage")
    base_id, canary_id = ids_of(fleet)
    fleet.set_version(fleet.workers()[1]["key"], "v12")
    for prompt in PROMPTS[:4]:
        healthy = complete(fleet, base_id, prompt, max_tokens=12)["nvext"]["completion_token_ids"]
        broken = complete(fleet, canary_id, prompt, max_tokens=12)["nvext"]["completion_token_ids"]
        assert len(broken) == 12 and len(set(broken)) <= 3 < len(set(healthy))
        # Distinct bigrams: a healthy reply has nearly all of them, garbage a handful.
        assert len(set(itertools.pairwise(broken))) <= 3


def test_zero_length_replies_are_empty_and_finish_at_once(fleet):
    fleet.set_broken("v13", "zero_length")
    _, canary_id = ids_of(fleet)
    fleet.set_version(fleet.workers()[1]["key"], "v13")
    reply = complete(fleet, canary_id, PROMPTS[0])
    (choice,) = reply["choices"]
    assert reply["nvext"]["completion_token_ids"] == [] and choice["text"] == ""
    assert choice["finish_reason"] == "stop" and reply["nvext"]["detailed_finish_reason"] == "eos"
    assert reply["usage"]["completion_tokens"] == 0
    # Streaming still ends with one finishing event.
    events = stream(fleet, canary_id, PROMPTS[0], max_tokens=8)
    assert [e["choices"][0]["finish_reason"] for e in events] == ["stop"]
    assert events[0]["nvext"]["completion_token_ids"] == []


def test_nan_logprobs_arrive_as_dynamo_delivers_them(fleet):
    """Dynamo 1.6.1's vLLM path loses NaN chosen-token logprobs (the choice has none) and
    clamps NaN prompt logprobs to -1e30; mode `null` writes nulls."""
    fleet.set_broken("v14", "nan_logprobs")
    _, canary_id = ids_of(fleet)
    fleet.set_version(fleet.workers()[1]["key"], "v14")
    reply = complete(fleet, canary_id, PROMPTS[0], prompt_logprobs=1)
    assert "logprobs" not in reply["choices"][0]
    assert len(reply["nvext"]["completion_token_ids"]) == 8
    values = [v["logprob"] for e in reply["nvext"]["prompt_logprobs"][1:] for v in e.values()]
    assert values and set(values) == {MIN_FINITE_LOGPROB}

    fleet.set_broken("v14", {"kind": "nan_logprobs", "mode": "null"})
    raw = HTTP.post(
        f"{fleet.frontend_url}/v1/completions",
        json={
            "model": "sim-model",
            "prompt": PROMPTS[0],
            "max_tokens": 3,
            "logprobs": 0,
            "prompt_logprobs": 0,
            "nvext": {"backend_instance_id": canary_id, "extra_fields": ["prompt_logprobs"]},
        },
    )
    # Strict JSON: a NaN is written null, never as a bare NaN token.
    reply = json.loads(raw.text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert reply["choices"][0]["logprobs"]["token_logprobs"] == [None, None, None]
    assert all(
        v["logprob"] is None for e in reply["nvext"]["prompt_logprobs"][1:] for v in e.values()
    )


def test_teacher_forcing_agrees_with_generation_for_the_same_tokens(fleet):
    worker = ids_of(fleet)[0]
    for prompt in PROMPTS[:4]:
        reply = complete(fleet, worker, prompt, max_tokens=6)
        generated = reply["nvext"]["completion_token_ids"]
        chosen = reply["choices"][0]["logprobs"]["token_logprobs"]
        assert teacher_forced(fleet, worker, prompt, generated) == chosen
        # Greedy: each generated token is the most likely one (rank 1) when teacher-forced.
        forced = complete(fleet, worker, prompt + generated, max_tokens=1, prompt_logprobs=2)
        entries = forced["nvext"]["prompt_logprobs"][len(prompt) :]
        assert [e[str(t)]["rank"] for e, t in zip(entries, generated, strict=True)] == [1] * 6
        # With k alternatives each entry holds the token plus up to k others, best first.
        assert all(1 <= len(e) <= 3 for e in entries)


def test_prompt_logprobs_follow_the_pinned_workers_version(fleet):
    (first, second), keys = ids_of(fleet), [w["key"] for w in fleet.workers()]
    fleet.set_version(keys[1], "v40")
    prompt = PROMPTS[0] + [17, 23, 29]
    a = complete(fleet, first, prompt, max_tokens=1, prompt_logprobs=0)
    b = complete(fleet, second, prompt, max_tokens=1, prompt_logprobs=0)
    assert a["nvext"]["worker_id"]["decode_worker_id"] == first
    assert b["nvext"]["worker_id"]["decode_worker_id"] == second
    assert a["nvext"]["prompt_logprobs"] != b["nvext"]["prompt_logprobs"]
    # The same version on the other worker gives the same numbers: weights, not the worker.
    fleet.set_version(keys[1], "v10")
    c = complete(fleet, second, prompt, max_tokens=1, prompt_logprobs=0)
    assert c["nvext"]["prompt_logprobs"] == a["nvext"]["prompt_logprobs"]
    # Without "prompt_logprobs" in extra_fields nothing is returned, as on the real frontend.
    plain = complete(fleet, first, prompt, max_tokens=1)
    assert "prompt_logprobs" not in plain["nvext"]


def stream(fleet, instance_id, prompt, **fields):
    body = {
        "model": "sim-model",
        "prompt": prompt,
        "stream": True,
        "logprobs": 0,
        "nvext": {"backend_instance_id": instance_id, "extra_fields": [*EXTRA, "prompt_logprobs"]},
        **fields,
    }
    events = []
    with HTTP.stream(
        "POST", f"{fleet.frontend_url}/v1/completions", json=body, timeout=10
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
    return events


def test_streaming_carries_prompt_logprobs_on_the_finishing_event(fleet):
    worker = ids_of(fleet)[0]
    unary = complete(fleet, worker, PROMPTS[1], max_tokens=4, prompt_logprobs=0)
    events = stream(
        fleet,
        worker,
        PROMPTS[1],
        max_tokens=4,
        prompt_logprobs=0,
        stream_options={"include_usage": True},
    )
    tokens, usage = events[:-1], events[-1]
    assert [e["nvext"]["completion_token_ids"][0] for e in tokens] == unary["nvext"][
        "completion_token_ids"
    ]
    assert [("prompt_logprobs" in e["nvext"]) for e in tokens] == [False, False, False, True]
    assert tokens[-1]["nvext"]["prompt_logprobs"] == unary["nvext"]["prompt_logprobs"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4


def test_a_slow_workers_latency_is_honoured_in_unary_and_streaming_replies(fleet):
    slow_key = fleet.workers()[1]["key"]
    slow = ids_of(fleet)[1]
    # sigma 0: every draw is exactly the median, so the bound below is exact, not luck.
    fleet.set_latency(
        slow_key, {"ttft": {"median": 0.3, "sigma": 0}, "per_token": {"median": 0.05, "sigma": 0}}
    )
    assert fleet.state(slow_key)["latency"]["ttft"] == {"median": 0.3, "sigma": 0}
    started = time.monotonic()
    complete(fleet, slow, PROMPTS[0], max_tokens=5)
    assert time.monotonic() - started >= 0.3 + 4 * 0.05
    arrivals = []
    started = time.monotonic()
    with HTTP.stream(
        "POST",
        f"{fleet.frontend_url}/v1/completions",
        json={
            "model": "sim-model",
            "prompt": PROMPTS[0],
            "max_tokens": 3,
            "stream": True,
            "nvext": {"backend_instance_id": slow},
        },
        timeout=10,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic() - started)
    assert len(arrivals) == 3
    # Lower bounds only: a busy client may read several events in one go, which can bring
    # their arrivals together but never earlier than the server sent them.
    assert arrivals[0] >= 0.3 and arrivals[2] >= 0.3 + 2 * 0.05
    fleet.set_latency(slow_key, None)  # back to the fleet default (a millisecond)
    assert fleet.state(slow_key)["latency"]["ttft"]["median"] == 0.001


def test_broken_checkpoints_over_the_control_api_refuse_bad_input(fleet):
    control = SimFleetControl(fleet.control_url)
    assert "marginal" in httpx.get(fleet.control_url + "/").json()["broken_checkpoint_kinds"]
    control.set_broken("v21", {"kind": "marginal", "magnitude": 1.2})
    assert control.lineage()["broken"]["v21"] == {
        "kind": "marginal",
        "magnitude": 1.2,
        "mode": "vllm",
    }
    with pytest.raises(SimFleetError, match="unknown broken checkpoint kind"):
        control.set_broken("v22", "melted")
    with pytest.raises(SimFleetError, match="unknown broken checkpoint keys"):
        control.set_broken("v22", {"kind": "drift", "severity": 3})
    assert set(control.lineage()["broken"]) == {"v21"}  # nothing changed
    control.set_broken("v21", None)
    assert control.lineage()["broken"] == {}
    control.set_lineage(None)
    assert control.lineage() is None
    with pytest.raises(SimFleetError, match="serves no lineage"):
        control.set_broken("v21", "drift")


def test_versions_outside_the_lineage_keep_their_unrelated_hash_outputs(fleet):
    from controlplane.simfleet import expected_completion_ids

    key, worker = fleet.workers()[0]["key"], ids_of(fleet)[0]
    fleet.set_version(key, "release-candidate")  # no step number: not in the lineage
    reply = complete(fleet, worker, PROMPTS[0], max_tokens=4)
    assert reply["nvext"]["completion_token_ids"] == expected_completion_ids(
        "release-candidate", PROMPTS[0], 4
    )


def test_the_command_line_configures_a_lineage_with_broken_checkpoints():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = build_config(
        parser.parse_args(
            [
                "--lineage-seed",
                "5",
                "--broken",
                "v7=drift",
                "--broken",
                "v8=marginal",
                "--ttft-ms",
                "20",
            ]
        )
    )
    assert config.lineage is not None and config.lineage.seed == 5
    assert {v: b.kind for v, b in config.lineage.broken.items()} == {
        "v7": "drift",
        "v8": "marginal",
    }
    assert config.latency.ttft.median == 0.02
    with pytest.raises(SystemExit, match="unknown broken checkpoint kind"):
        build_config(parser.parse_args(["--lineage-seed", "5", "--broken", "v7=melted"]))
    with pytest.raises(SystemExit, match="needs a lineage"):
        build_config(parser.parse_args(["--broken", "v7=drift"]))


def test_logprob_jitter_keeps_a_lineage_versions_weights(fleet):
    """The same weights under other numerics: logprobs move a little; a flip takes the
    runner-up at an uncertain position and continues greedily under the same weights."""
    from controlplane.simfleet import Fault

    key, worker = fleet.workers()[0]["key"], ids_of(fleet)[0]
    prompt = PROMPTS[2]
    clean = complete(fleet, worker, prompt, max_tokens=10)
    fleet.inject(key, "generate", Fault.logprob_jitter(0.002, once=True))
    jittered = complete(fleet, worker, prompt, max_tokens=10)
    assert jittered["nvext"]["completion_token_ids"] == clean["nvext"]["completion_token_ids"]
    pairs = zip(
        jittered["choices"][0]["logprobs"]["token_logprobs"],
        clean["choices"][0]["logprobs"]["token_logprobs"],
        strict=True,
    )
    assert all(abs(a - b) <= 0.002 for a, b in pairs)

    fleet.inject(key, "generate", Fault.logprob_jitter(0.002, flip_from=0, once=True))
    flipped = complete(fleet, worker, prompt, max_tokens=10)["nvext"]["completion_token_ids"]
    good = clean["nvext"]["completion_token_ids"]
    at = next(i for i, (a, b) in enumerate(zip(flipped, good, strict=True)) if a != b)
    forced = complete(fleet, worker, prompt + flipped, max_tokens=1, prompt_logprobs=0)
    entries = forced["nvext"]["prompt_logprobs"][len(prompt) :]
    ranks = [e[str(t)]["rank"] for e, t in zip(entries, flipped, strict=True)]
    assert ranks[at] == 2 and set(ranks[:at] + ranks[at + 1 :]) == {1}


def test_prompt_logprobs_are_a_top_level_field_and_must_be_a_count(fleet):
    worker = ids_of(fleet)[0]
    url = f"{fleet.frontend_url}/v1/completions"
    inside = HTTP.post(
        url,
        json={
            "model": "sim-model",
            "prompt": PROMPTS[0],
            "nvext": {"backend_instance_id": worker, "prompt_logprobs": 1},
        },
    )
    assert inside.status_code == 400
    assert "unknown field `prompt_logprobs`" in inside.json()["message"]
    bad = HTTP.post(
        url,
        json={
            "model": "sim-model",
            "prompt": PROMPTS[0],
            "prompt_logprobs": -1,
            "nvext": {"backend_instance_id": worker, "extra_fields": ["prompt_logprobs"]},
        },
    )
    assert bad.status_code == 400 and bad.json()["type"] == "Bad Request"
