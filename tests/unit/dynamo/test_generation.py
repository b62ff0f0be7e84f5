# ruff: noqa: E501  (contract messages are quoted verbatim)
import copy
import json

import pytest

from controlplane.dynamo.generation import (
    GenerationCheck,
    evaluate_completion,
    run_generation_check,
)
from controlplane.dynamo.policy import OutboundPolicy

BIG_ID = 16486194599384006736
CHECK = GenerationCheck(model="m", prompt_token_ids=(5, 6, 7, 8), max_tokens=3, expected_model="m")


def good_body(**nvext_over):
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [
            {
                "text": "abc",
                "index": 0,
                "logprobs": {
                    "tokens": ["a", "b", "c"],
                    "token_logprobs": [-0.1, -0.2, -0.3],
                    "top_logprobs": [],
                    "text_offset": [],
                },
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3},
        "nvext": {
            "completion_token_ids": [1877, 1136, 1594],
            "prompt_token_ids": [5, 6, 7, 8],
            "detailed_finish_reason": "length",
        },
    }
    body["nvext"].update(nvext_over)
    return body


def test_request_body_matches_contract():
    check = GenerationCheck("m", [5, 6, 7, 8], max_tokens=5, backend_instance_id=BIG_ID)
    body = check.request_body()
    assert body == {
        "model": "m",
        "prompt": [5, 6, 7, 8],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": 0,
        "n": 1,
        "stream": False,
        "nvext": {
            "extra_fields": [
                "completion_token_ids",
                "prompt_token_ids",
                "detailed_finish_reason",
                "worker_id",
            ],
            "backend_instance_id": BIG_ID,
        },
    }
    # Exact JSON integer, not a float rendering.
    assert f'"backend_instance_id": {BIG_ID}' in json.dumps(body)
    assert "backend_instance_id" not in GenerationCheck("m", [1]).request_body()["nvext"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt_token_ids": []},
        {"prompt_token_ids": [1, -1]},
        {"prompt_token_ids": [1, True]},
        {"max_tokens": 0},
        {"backend_instance_id": -1},
        {"backend_instance_id": 2**64},
        {"backend_instance_id": 1.0},
    ],
)
def test_check_validation(kwargs):
    with pytest.raises(ValueError):
        GenerationCheck(**{"model": "m", "prompt_token_ids": [1], **kwargs})


def test_good_length_verdict():
    verdict = evaluate_completion(CHECK, 200, good_body())
    assert verdict.ok, verdict.reason
    assert verdict.completion_token_ids == (1877, 1136, 1594)
    assert verdict.prompt_token_ids == (5, 6, 7, 8)
    assert verdict.finish_reason == "length" and verdict.detailed_finish_reason == "length"


def test_good_eos_stop_without_logprobs():
    # The sample engine: [1,2] with EOS=2, finish stop; the mocker sends no logprobs.
    body = good_body(completion_token_ids=[1, 2], detailed_finish_reason="eos")
    body["choices"][0]["finish_reason"] = "stop"
    del body["choices"][0]["logprobs"]
    assert evaluate_completion(CHECK, 200, body).ok


def mutate(fn):
    body = copy.deepcopy(good_body())
    fn(body)
    return body


BAD = [
    (
        "two choices",
        lambda b: b["choices"].append(copy.deepcopy(b["choices"][0])),
        "exactly one choice",
    ),
    ("no choices", lambda b: b.update(choices=[]), "exactly one choice"),
    (
        "nvext inside choice",
        lambda b: b["choices"][0].update(nvext=b.pop("nvext")),
        "found inside the choice",
    ),
    ("no nvext", lambda b: b.pop("nvext"), "completion_token_ids missing"),
    ("empty completion", lambda b: b["nvext"].update(completion_token_ids=[]), "non-empty"),
    ("non-int ids", lambda b: b["nvext"].update(completion_token_ids=["a"]), "non-empty"),
    ("prompt not echoed", lambda b: b["nvext"].pop("prompt_token_ids"), "prompt_token_ids missing"),
    (
        "prompt differs",
        lambda b: b["nvext"].update(prompt_token_ids=[5, 6, 7]),
        "differ from the sent",
    ),
    ("prompt order", lambda b: b["nvext"].update(prompt_token_ids=[8, 7, 6, 5]), "differ"),
    (
        "logprobs short",
        lambda b: b["choices"][0]["logprobs"].update(tokens=["a", "b"], token_logprobs=[-1, -1]),
        "logprobs cover 2 tokens",
    ),
    (
        "logprobs bad value",
        lambda b: b["choices"][0]["logprobs"].update(token_logprobs=[-1, None, -1]),
        "non-number",
    ),
    (
        "logprobs positive",
        lambda b: b["choices"][0]["logprobs"].update(token_logprobs=[-1, 0.5, -1]),
        "impossible",
    ),
    ("logprobs shape", lambda b: b["choices"][0].update(logprobs={"content": []}), "lacks tokens"),
    (
        "cancelled",
        lambda b: (
            b["choices"][0].update(finish_reason="stop"),
            b["nvext"].update(detailed_finish_reason="cancelled"),
        ),
        "'cancelled' is not a normal finish",
    ),
    (
        "stop without detail",
        lambda b: (
            b["choices"][0].update(finish_reason="stop"),
            b["nvext"].pop("detailed_finish_reason"),
        ),
        "cannot rule out cancellation",
    ),
    ("no finish", lambda b: b["choices"][0].update(finish_reason=None), "not a terminal"),
    (
        "content filter",
        lambda b: b["choices"][0].update(finish_reason="content_filter"),
        "not a terminal",
    ),
    ("finish disagrees", lambda b: b["nvext"].update(detailed_finish_reason="eos"), "disagrees"),
    ("wrong model", lambda b: b.update(model="other"), "not the expected 'm'"),
    ("error key", lambda b: b.update(error={"message": "engine failed"}), "carries an error"),
    (
        "too many ids",
        lambda b: (
            b["nvext"].update(completion_token_ids=[1, 2, 3, 4]),
            b["choices"][0]["logprobs"].update(tokens=list("abcd"), token_logprobs=[-1] * 4),
        ),
        "exceed max_tokens",
    ),
    (
        "length but short",
        lambda b: (
            b["nvext"].update(completion_token_ids=[1, 2]),
            b["choices"][0]["logprobs"].update(tokens=list("ab"), token_logprobs=[-1] * 2),
        ),
        "expected max_tokens=3",
    ),
]


@pytest.mark.parametrize(("name", "fn", "reason"), BAD, ids=[b[0] for b in BAD])
def test_bad_verdicts(name, fn, reason):
    verdict = evaluate_completion(CHECK, 200, mutate(fn))
    assert not verdict.ok
    assert reason in verdict.reason


def test_stop_without_detail_ok_when_length():
    body = good_body()
    del body["nvext"]["detailed_finish_reason"]
    assert evaluate_completion(CHECK, 200, body).ok


def test_model_not_checked_without_expectation():
    check = GenerationCheck("m", (5, 6, 7, 8), max_tokens=3)
    assert evaluate_completion(check, 200, mutate(lambda b: b.update(model="x"))).ok


def test_http_400_bodies_from_contract():
    n_body = {
        "message": 'Validation: `nvext.extra_fields=["completion_token_ids"]` requires exactly one generated choice',
        "type": "Bad Request",
        "code": 400,
    }
    verdict = evaluate_completion(CHECK, 400, n_body)
    assert not verdict.ok and verdict.http_status == 400
    assert "requires exactly one generated choice" in verdict.reason

    pinned = GenerationCheck("m", (5, 6, 7, 8), max_tokens=3, backend_instance_id=BIG_ID)
    invalid = {"message": "Invalid request", "type": "Bad Request", "code": 400}
    verdict = evaluate_completion(pinned, 400, invalid)
    assert not verdict.ok and str(BIG_ID) in verdict.reason


def test_a_pinned_check_must_be_answered_by_the_pinned_worker():
    pinned = GenerationCheck("m", (5, 6, 7, 8), max_tokens=3, backend_instance_id=BIG_ID)
    by = {"prefill_worker_id": BIG_ID, "decode_worker_id": BIG_ID}
    assert evaluate_completion(pinned, 200, good_body(worker_id=by)).ok
    # A frontend that omits worker_id is not held against the worker.
    assert evaluate_completion(pinned, 200, good_body()).ok
    other = {"prefill_worker_id": 7, "decode_worker_id": 7}
    verdict = evaluate_completion(pinned, 200, good_body(worker_id=other))
    assert not verdict.ok
    assert verdict.reason == f"pinned to backend_instance_id {BIG_ID} but worker 7 generated"
    # An unpinned check accepts whichever replica answered.
    assert evaluate_completion(CHECK, 200, good_body(worker_id=other)).ok


def test_non_object_and_5xx():
    assert "not a JSON object" in evaluate_completion(CHECK, 200, "text").reason
    assert evaluate_completion(CHECK, 503, None).reason == "HTTP 503: no body"


async def test_run_generation_check_over_http(server, client, loopback_policy):
    server.json("/v1/completions", good_body())
    verdict = await run_generation_check(client, loopback_policy, server.base_url, CHECK, timeout=5)
    assert verdict.ok, verdict.reason
    assert json.loads(server.bodies["/v1/completions"][0]) == CHECK.request_body()


async def test_run_generation_check_policy_and_timeout(server, client, loopback_policy):
    policy = OutboundPolicy.from_cidrs(["10.0.0.0/8"])
    verdict = await run_generation_check(client, policy, server.base_url, CHECK, timeout=5)
    assert not verdict.ok and verdict.reason.startswith("outbound policy")
    assert server.hits == {}
    server.route("/v1/completions", server.hang)
    verdict = await run_generation_check(
        client, loopback_policy, server.base_url, CHECK, timeout=0.2
    )
    assert not verdict.ok and "timed out" in verdict.reason


async def test_a_frontend_reply_that_is_not_http_is_a_verdict(not_http, client, loopback_policy):
    verdict = await run_generation_check(client, loopback_policy, not_http, CHECK, timeout=5)
    assert not verdict.ok and verdict.reason.startswith("frontend unreachable: "), verdict.reason
