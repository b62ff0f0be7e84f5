"""`Frontend.pinned_completion` against a scripted frontend: the pinned token-id request, the
attempt headers, retries that keep their attempt identity, and refusals."""

from __future__ import annotations

import json

import httpx
import pytest
from dynamo_rl_trainer import DuplicateAttempt, Frontend, GenerationError

REPLY = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": "policy",
    "choices": [{"index": 0, "text": " a b", "finish_reason": "length"}],
    "nvext": {"completion_token_ids": [17, 18]},
}


def frontend(handler) -> Frontend:
    return Frontend("http://fe.test", model="policy", transport=httpx.MockTransport(handler))


def call(fe: Frontend, **kwargs):
    options = {
        "instance_id": 18446744073709551611,
        "policy_version": "step-2",
        "rollout_id": "r-1",
        "attempt_id": "a-1",
        "max_tokens": 2,
    } | kwargs
    return fe.pinned_completion([5, 6, 7], **options)


def test_the_request_is_pinned_token_ids_with_the_engines_ids_asked_for():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json=REPLY)

    completion = call(frontend(handler), prompt_logprobs=2)
    (request,) = seen
    body = json.loads(request.content)
    assert request.url.path == "/v1/completions"
    assert body["prompt"] == [5, 6, 7] and body["model"] == "policy" and body["max_tokens"] == 2
    assert body["nvext"]["backend_instance_id"] == 18446744073709551611
    assert set(body["nvext"]["extra_fields"]) >= {
        "completion_token_ids",
        "prompt_token_ids",
        "prompt_logprobs",
        "worker_id",
        "detailed_finish_reason",
    }
    assert body["logprobs"] == 0 and body["prompt_logprobs"] == 2
    assert request.headers["x-rl-policy-version"] == "step-2"
    assert request.headers["x-rl-rollout-id"] == "r-1"
    assert request.headers["x-rl-attempt-id"] == "a-1"
    assert completion.reply == REPLY and completion.sends == 1


def test_prompt_logprobs_are_only_asked_for_on_request():
    seen = []
    call(frontend(lambda r: seen.append(json.loads(r.content)) or httpx.Response(200, json=REPLY)))
    assert "prompt_logprobs" not in seen[0]
    assert "prompt_logprobs" not in seen[0]["nvext"]["extra_fields"]


def test_a_timed_out_send_is_retried_as_the_same_attempt():
    seen = []

    def handler(request):
        seen.append(
            (
                request.headers["x-rl-rollout-id"],
                request.headers["x-rl-attempt-id"],
                request.content,
            )
        )
        if len(seen) == 1:
            raise httpx.ReadTimeout("no answer in time")
        if len(seen) == 2:
            return httpx.Response(
                503, json={"message": "busy", "type": "Service Unavailable", "code": 503}
            )
        return httpx.Response(200, json=REPLY)

    completion = call(frontend(handler))
    assert completion.sends == 3
    assert len(set(seen)) == 1  # same ids, same body, every time
    assert "timed out" in completion.errors[0]


def test_an_answered_attempt_is_never_sent_again():
    sends = []
    fe = frontend(lambda r: sends.append(1) or httpx.Response(200, json=REPLY))
    call(fe)
    with pytest.raises(DuplicateAttempt):
        call(fe)
    call(fe, attempt_id="a-2")  # a new attempt of the same rollout is fine
    assert len(sends) == 2


def test_an_unknown_pinned_instance_is_refused_without_retrying():
    sends = []

    def handler(request):
        sends.append(1)
        return httpx.Response(
            400, json={"message": "Invalid request", "type": "Bad Request", "code": 400}
        )

    with pytest.raises(GenerationError) as refused:
        call(frontend(handler))
    assert (refused.value.status, refused.value.message, refused.value.retryable) == (
        400,
        "Invalid request",
        False,
    )
    assert len(sends) == 1


def test_no_answer_after_every_try_is_a_retryable_error():
    def handler(request):
        raise httpx.ConnectError("down")

    with pytest.raises(GenerationError) as failed:
        call(frontend(handler), tries=2)
    assert failed.value.retryable and "after 2 sends" in str(failed.value)


def test_prompts_must_be_token_ids_and_pins_ints():
    fe = frontend(lambda r: httpx.Response(200, json=REPLY))
    with pytest.raises(TypeError):
        fe.pinned_completion(
            "hello", instance_id=1, policy_version="v", rollout_id="r", attempt_id="a", max_tokens=1
        )  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        call(fe, instance_id="18446744073709551611")
