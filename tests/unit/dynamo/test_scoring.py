"""The scoring client (`dynamo/scoring.py`) against a real local HTTP server replaying replies
captured from the real Dynamo 1.6.1 frontend (tests/fixtures/dynamo/completions-1.6.1.json),
and against hostile ones."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controlplane.dynamo.policy import OutboundPolicy
from controlplane.dynamo.scoring import (
    CohortPrompt,
    EventStream,
    ScoringRequest,
    continuation_logprobs,
    observe,
    observe_cohort,
)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "dynamo" / "completions-1.6.1.json"
CAPTURED = json.loads(FIXTURE.read_text())["exchanges"]
PINNED = 10029315292885286686  # the instance the captures were pinned to (above 2**53)
PROMPT = [5, 6, 7]
CONTINUATION = [8, 9, 10]  # prompt + continuation = the captured teacher-forcing prompt
GENERATED = [389, 164, 448, 223, 507, 282]


def captured_sse(name: str = "gen_stream") -> bytes:
    return CAPTURED[name]["sse"].encode()


def captured_body(name: str = "tf_full") -> dict[str, Any]:
    return copy.deepcopy(CAPTURED[name]["body"])


def frontend(server, *, sse: bytes | None = None, teacher: Any = None):
    """Serve /v1/completions: a streamed request gets `sse`, a unary one `teacher`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            await response.write(sse if sse is not None else captured_sse())
            await response.write_eof()
            return response
        return web.json_response(teacher if teacher is not None else captured_body())

    server.route("/v1/completions", handler)


async def run(server, client, policy, **kw) -> Any:
    args = {
        "model": "tiny-policy",
        "instance_id": PINNED,
        "prompt_index": 3,
        "prompt_ids": PROMPT,
        "continuation_ids": CONTINUATION,
        "max_tokens": 6,
        "policy": policy,
        "timeout": 5,
    }
    args.update(kw)
    return await observe(client, server.base_url, **args)


# -- requests ----------------------------------------------------------------------------------


def test_the_generation_request_is_pinned_greedy_and_streamed():
    request = ScoringRequest.build(
        model="m", instance_id=str(PINNED), prompt_ids=PROMPT, continuation_ids=None, max_tokens=6
    )
    body = request.generation_body()
    assert body == {
        "model": "m",
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0,
        "n": 1,
        "logprobs": 0,
        "stream": True,
        "nvext": {
            "backend_instance_id": PINNED,
            "extra_fields": ["completion_token_ids", "detailed_finish_reason", "worker_id"],
        },
    }
    # The u64 survives the JSON encoding exactly (no float rounding above 2**53).
    assert f'"backend_instance_id": {PINNED}' in json.dumps(body)


def test_the_teacher_forcing_request_asks_for_prompt_logprobs_at_top_level():
    request = ScoringRequest.build(
        model="m",
        instance_id=PINNED,
        prompt_ids=PROMPT,
        continuation_ids=CONTINUATION,
        max_tokens=6,
    )
    body = request.teacher_forcing_body()
    assert body["prompt"] == PROMPT + CONTINUATION
    assert body["max_tokens"] == 1 and body["temperature"] == 0 and body["stream"] is False
    assert body["prompt_logprobs"] == 0
    # 1.6.1 returns nvext.prompt_logprobs only when the extra field names it, and refuses
    # prompt_logprobs inside nvext (captured: tf_no_extra_field, tf_in_nvext_only).
    assert "prompt_logprobs" in body["nvext"]["extra_fields"]
    assert "prompt_logprobs" not in body["nvext"]
    assert CAPTURED["tf_in_nvext_only"]["status"] == 400
    assert "prompt_logprobs" not in CAPTURED["tf_no_extra_field"]["body"]["nvext"]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"prompt_ids": []}, "must not be empty"),
        ({"prompt_ids": [1, -1]}, "non-negative"),
        ({"prompt_ids": [True]}, "non-negative"),
        ({"prompt_ids": "123"}, "list of token ids"),
        ({"continuation_ids": []}, "must not be empty"),
        ({"instance_id": "12a"}, "not a decimal"),
        ({"instance_id": 2**64}, "unsigned 64-bit"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"model": ""}, "model"),
        ({"prompt_ids": [1] * 70000}, "exceed"),
    ],
)
def test_bad_arguments_are_refused_before_sending(kw, message):
    args = {
        "model": "m",
        "instance_id": 1,
        "prompt_ids": [1],
        "continuation_ids": None,
        "max_tokens": 1,
    }
    with pytest.raises(ValueError, match=message):
        ScoringRequest.build(**{**args, **kw})


# -- the captured 1.6.1 replies ------------------------------------------------------------------


async def test_an_observation_from_the_captured_replies(server, client, loopback_policy):
    frontend(server)
    seen = await run(server, client, loopback_policy)
    assert seen.error is None
    assert seen.prompt_index == 3 and seen.instance_id == str(PINNED)
    assert seen.completion_ids == tuple(GENERATED)
    assert seen.completion_logprobs == (-0.25,) * 6
    assert seen.finish_reason == "length"
    assert seen.continuation_logprobs == (-0.25, -0.25, -0.25)
    assert seen.ttft_ms is not None and seen.total_ms is not None
    assert 0 < seen.ttft_ms <= seen.total_ms
    sent = [json.loads(b) for b in server.bodies["/v1/completions"]]
    assert [b["stream"] for b in sent] == [True, False]
    assert all(b["nvext"]["backend_instance_id"] == PINNED for b in sent)


async def test_without_a_continuation_only_generation_is_sent(server, client, loopback_policy):
    frontend(server)
    seen = await run(server, client, loopback_policy, continuation_ids=None)
    assert seen.error is None and seen.continuation_logprobs is None
    assert server.hits["/v1/completions"] == 1


async def test_a_path_without_prompt_logprobs_leaves_drift_unavailable(
    server, client, loopback_policy
):
    frontend(server, teacher=captured_body("tf_no_extra_field"))
    seen = await run(server, client, loopback_policy)
    assert seen.error is None
    assert seen.continuation_logprobs is None  # unavailable, never invented
    assert seen.completion_ids == tuple(GENERATED)


async def test_time_to_first_token_is_measured_when_the_first_event_lands(
    server, client, loopback_policy
):
    events = captured_sse().split(b"\n\n")

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(0.1)
        await response.write(events[0] + b"\n\n")
        await asyncio.sleep(0.3)
        await response.write(b"\n\n".join(events[1:]))
        await response.write_eof()
        return response

    server.route("/v1/completions", slow)
    seen = await run(server, client, loopback_policy, continuation_ids=None)
    assert seen.error is None
    assert seen.ttft_ms is not None and seen.total_ms is not None
    assert seen.ttft_ms >= 100
    assert seen.total_ms - seen.ttft_ms >= 290


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_events_split_anywhere_read_the_same(newline):
    text = captured_sse().replace(b"\n", newline)
    whole = EventStream(6)
    whole.feed(text)
    whole.finish()
    bytewise = EventStream(6)
    for i in range(len(text)):
        bytewise.feed(text[i : i + 1])
    bytewise.finish()
    assert whole.problem is None and bytewise.problem is None
    assert whole.generated == bytewise.generated
    assert whole.generated.completion_ids == GENERATED and whole.generated.done


def test_an_endless_event_is_given_up():
    stream = EventStream(6)
    for _ in range(70):
        stream.feed(b"data: " + b"x" * 16384)
    assert stream.problem == "a stream event is over 1048576 bytes"
    assert len(stream._pending) <= 1024 * 1024 + 16384 + 6


def test_streamed_teacher_forcing_capture_keeps_prompt_logprobs_on_the_final_event():
    final = json.loads(CAPTURED["tf_stream"]["sse"].split("\n\n")[0][len("data: ") :])
    assert final["choices"][0]["finish_reason"] == "length"
    assert len(final["nvext"]["prompt_logprobs"]) == 6


# -- hostile and failing replies -----------------------------------------------------------------


async def test_an_unroutable_pinned_instance_is_an_error(server, client, loopback_policy):
    async def refuse(request: web.Request) -> web.StreamResponse:
        # 1.6.1 refuses an unroutable pin before streaming: plain JSON, not an event.
        refused = CAPTURED["err_unknown_instance_stream"]["sse"]
        return web.Response(text=refused, status=400, content_type="application/json")

    server.route("/v1/completions", refuse)
    seen = await run(server, client, loopback_policy)
    assert seen.error == (
        f"HTTP 400: Invalid request (backend_instance_id {PINNED} not routable, "
        f"or a token id outside the vocabulary)"
    )
    assert seen.completion_ids == () and seen.continuation_logprobs is None


async def test_a_teacher_forcing_failure_keeps_the_generation_facts(
    server, client, loopback_policy
):
    async def handler(request: web.Request) -> web.StreamResponse:
        if (await request.json())["stream"]:
            return web.Response(body=captured_sse(), content_type="text/event-stream")
        return web.json_response(CAPTURED["err_unknown_model"]["body"], status=404)

    server.route("/v1/completions", handler)
    seen = await run(server, client, loopback_policy)
    assert seen.error == "teacher forcing: HTTP 404: Model not found"
    assert seen.completion_ids == tuple(GENERATED)
    assert seen.continuation_logprobs is None


def sse(*events: Any, done: bool = True) -> bytes:
    parts = [b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) for e in events]
    if done:
        parts.append(b"data: [DONE]")
    return b"\n\n".join(parts) + b"\n\n"


def token_event(ids, *, finish=None, worker=PINNED, logprobs=None) -> dict[str, Any]:
    choice: dict[str, Any] = {"text": "x", "index": 0}
    if logprobs is not False:
        values = logprobs if logprobs is not None else [-0.5] * len(ids)
        choice["logprobs"] = {"tokens": ["x"] * len(values), "token_logprobs": values}
    if finish:
        choice["finish_reason"] = finish
    nvext: dict[str, Any] = {"completion_token_ids": ids}
    if worker is not None:
        nvext["worker_id"] = {"decode_worker_id": worker, "prefill_worker_id": worker}
    return {"choices": [choice], "nvext": nvext}


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (sse(token_event([3], finish="length"), done=False), "without [DONE]"),
        (sse(token_event([3])), "no finish_reason"),
        (sse(b"{not json"), "not JSON"),
        (sse(b"[" * 100 + b"]" * 100), "not JSON"),
        (sse([1, 2]), "not a JSON object"),
        (sse({"choices": "x"}), "single-choice"),
        (sse({"choices": [{}, {}]}), "single-choice"),
        (sse({"choices": [1]}), "choice is not an object"),
        (sse({"choices": [{}], "nvext": []}), "nvext is not an object"),
        (sse(token_event(["a"], finish="length")), "not a list of token ids"),
        (sse(token_event([1, 2, 3, 4, 5, 6, 7], finish="length")), "more than max_tokens"),
        (sse(token_event([3], logprobs=[-1.0, -2.0], finish="length")), "2 logprobs for 1 ids"),
        (sse(token_event([3], finish="length", worker=7)), "but worker 7 generated"),
        (sse({"error": {"message": "engine died"}}), "engine died"),
        (sse(*[{"choices": []}] * 20), "more than 14 events"),
        (sse(token_event([3], finish="length")) + b"data: {}\n\n", "data after [DONE]"),
    ],
)
async def test_a_malformed_stream_is_an_error_not_an_exception(
    server, client, loopback_policy, stream, message
):
    frontend(server, sse=stream)
    seen = await run(server, client, loopback_policy, continuation_ids=None)
    assert seen.error is not None and message in seen.error, seen.error


async def test_keepalives_usage_events_and_missing_logprobs_are_tolerated(
    server, client, loopback_policy
):
    stream = (
        b": keep-alive\n\n"
        + sse(token_event([3], logprobs=False), token_event([4], logprobs=False, finish="stop"))
        + b""
    )
    stream = stream.replace(b"data: [DONE]", b'data: {"choices": [], "usage": {}}\n\ndata: [DONE]')
    frontend(server, sse=stream.replace(b"\n", b"\r\n"))
    seen = await run(server, client, loopback_policy, continuation_ids=None)
    assert seen.error is None
    assert seen.completion_ids == (3, 4)
    assert seen.completion_logprobs == ()  # no logprobs at all: empty, not invented
    assert seen.finish_reason == "stop"


async def test_impossible_logprobs_become_missing_values(server, client, loopback_policy):
    frontend(server, sse=sse(token_event([3, 4], logprobs=[None, 0.5], finish="length")))
    seen = await run(server, client, loopback_policy, continuation_ids=None)
    assert seen.error is None
    assert seen.completion_logprobs == (None, None)


def teacher_request() -> ScoringRequest:
    return ScoringRequest.build(
        model="m",
        instance_id=PINNED,
        prompt_ids=PROMPT,
        continuation_ids=CONTINUATION,
        max_tokens=1,
    )


def with_prompt_logprobs(entries: Any, worker: Any = PINNED) -> dict[str, Any]:
    body = captured_body()
    body["nvext"]["prompt_logprobs"] = entries
    body["nvext"]["worker_id"] = {"decode_worker_id": worker}
    return body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("text", "not a JSON object"),
        ({"error": {"message": "boom"}}, "carries an error: boom"),
        ({"nvext": 5}, "nvext is not an object"),
        (with_prompt_logprobs({"0": 1}), "no list of entries"),
        (with_prompt_logprobs([None] * 5), "has 5 entries for a 6-token prompt"),
        (with_prompt_logprobs([None, {}, {}, [], {}, {}]), "prompt_logprobs[3] is not an object"),
        (with_prompt_logprobs([None] * 6, worker=PINNED + 1), "but worker"),
    ],
)
def test_malformed_prompt_logprobs_are_reasons(body, message):
    values, problem = continuation_logprobs(body, teacher_request())
    assert values is None and problem is not None and message in problem, problem


def test_prompt_logprobs_are_read_by_the_forced_token_not_by_position_in_the_map():
    entries = [
        None,
        {"6": {"logprob": -0.1}},
        {"7": {"logprob": -0.2}},
        # k > 0: an alternative listed first must not be taken for the forced token.
        {"99": {"logprob": -0.01, "rank": 1}, "8": {"logprob": -3.0, "rank": 2}},
        {"42": {"logprob": -0.5}},  # the forced token 9 is missing: no value
        {"10": {"logprob": "x"}},  # not a number: no value
    ]
    values, problem = continuation_logprobs(with_prompt_logprobs(entries), teacher_request())
    assert problem is None
    assert values == (-3.0, None, None)


async def test_a_reply_over_the_size_cap_is_an_error(server, client, loopback_policy):
    huge = captured_body()
    huge["nvext"]["padding"] = "x" * (5 * 1024 * 1024)
    frontend(server, teacher=huge)
    seen = await run(server, client, loopback_policy)
    assert seen.error == "teacher-forcing reply too large"
    assert seen.completion_ids == tuple(GENERATED)


async def test_the_outbound_policy_is_checked_before_sending(server, client):
    frontend(server)
    seen = await run(server, client, OutboundPolicy.from_cidrs(["10.0.0.0/8"]))
    assert seen.error is not None and seen.error.startswith("outbound policy:")
    assert server.hits.get("/v1/completions") is None


async def test_a_hung_frontend_times_out(server, client, loopback_policy):
    server.route("/v1/completions", server.hang)
    seen = await run(server, client, loopback_policy, timeout=0.3)
    assert seen.error == "frontend timed out after 0.3s"


async def test_a_peer_that_is_not_http_is_an_error(not_http, client, loopback_policy):
    seen = await observe(
        client,
        not_http,
        model="m",
        instance_id=1,
        prompt_index=0,
        prompt_ids=[1],
        continuation_ids=None,
        max_tokens=1,
        policy=loopback_policy,
        timeout=5,
    )
    assert seen.error is not None and seen.error.startswith("frontend unreachable")


# -- cohorts ------------------------------------------------------------------------------------


async def test_a_cohort_round_robins_prompts_with_bounded_concurrency(
    server, client, loopback_policy
):
    in_flight = 0
    peak = 0
    pinned: dict[int, int] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal in_flight, peak
        body = await request.json()
        worker = body["nvext"]["backend_instance_id"]
        pinned[body["prompt"][0]] = worker
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.05)
            stream = sse(token_event([body["prompt"][0]], finish="length", worker=worker))
            return web.Response(body=stream, content_type="text/event-stream")
        finally:
            in_flight -= 1

    server.route("/v1/completions", handler)
    prompts = [CohortPrompt(index=10 + i, prompt_ids=(100 + i,)) for i in range(7)]
    seen = await observe_cohort(
        client,
        server.base_url,
        model="m",
        instance_ids=["11", "22", "33"],
        prompts=prompts,
        max_tokens=1,
        policy=loopback_policy,
        timeout=5,
        concurrency=2,
    )
    assert [o.prompt_index for o in seen] == list(range(10, 17))
    assert [o.instance_id for o in seen] == ["11", "22", "33", "11", "22", "33", "11"]
    assert all(o.error is None for o in seen)
    assert [o.completion_ids for o in seen] == [(100 + i,) for i in range(7)]
    assert pinned == {100 + i: [11, 22, 33][i % 3] for i in range(7)}
    assert peak == 2


async def test_a_cohort_with_a_bad_prompt_sends_nothing(server, client, loopback_policy):
    frontend(server)
    prompts = [CohortPrompt(0, (1,)), CohortPrompt(1, ())]
    with pytest.raises(ValueError, match="must not be empty"):
        await observe_cohort(
            client,
            server.base_url,
            model="m",
            instance_ids=[1],
            prompts=prompts,
            max_tokens=1,
            policy=loopback_policy,
            timeout=5,
        )
    with pytest.raises(ValueError, match="at least one instance"):
        await observe_cohort(
            client,
            server.base_url,
            model="m",
            instance_ids=[],
            prompts=prompts[:1],
            max_tokens=1,
            policy=loopback_policy,
            timeout=5,
        )
    assert server.hits.get("/v1/completions") is None


@pytest.mark.parametrize(
    ("raw", "read"),
    [
        (-0.5, -0.5),
        (0, 0.0),
        (-1e30, None),
        (-1e29, None),
        (-1e28, -1e28),
        (None, None),
        (0.1, None),
    ],
)
def test_a_clamped_non_finite_logprob_reads_as_none(raw, read):
    # Dynamo 1.6.1's vLLM worker sends a NaN prompt logprob as -1e30: not a real value.
    from controlplane.dynamo.scoring import _logprob

    assert _logprob(raw) == read
