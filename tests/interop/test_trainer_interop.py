"""The trainer library against real Dynamo 1.6.1: a pinned token-id completion through the
real frontend, served by a real (scripted) generation worker on the Dynamo runtime, is read by
the library and accepted by the guard; the stored fixture the library's unit tests read
(`clients/python/tests/fixtures/dynamo-1.6.1.json`) still has the live reply's shape."""

from __future__ import annotations

import time

import httpx
import pytest
from dynamo_rl_trainer import AdmissionGuard, Frontend, Gate, GateView, GenerationError, admit
from dynamo_rl_trainer.guard import Sample
from dynamo_rl_trainer.results import AdmittedInstances, WorkerIdentity

from tests.integration.trainer.replies import store_or_compare
from tests.interop.conftest import WorkerSpec
from tests.interop.programs.synthetic_model import policy_tokens

pytestmark = pytest.mark.interop

PROMPT = [5, 6, 7, 8]
MODEL = "tiny-policy"


def view_of(instances: tuple[int, ...], version: str) -> GateView:
    gate = Gate(
        source="dynamo",
        namespace="rl-a",
        state="open",
        open=True,
        verified_version=version,
        verified_instances=instances,
        since=time.time() - 60,
        reason="",
        revision=1,
        active_refresh_id=None,
    )
    identities = tuple(WorkerIdentity(i, "rl-a", MODEL) for i in instances)
    return GateView(AdmittedInstances(gate=gate, instances=identities))


def test_a_real_frontend_reply_is_read_and_admitted_by_the_guard(dynamo_deployment):
    dep = dynamo_deployment(
        [WorkerSpec("backend", namespace="rl-a", model_name=MODEL) for _ in range(2)],
        frontend_env={"DYN_NAMESPACE_PREFIX": "rl"},
    )
    listed = dep.listing()["workers"]
    ids = sorted(int(w["instance_id"]) for w in listed)
    urls = {int(w["instance_id"]): w["system_url"] for w in listed}
    for iid in ids:
        reply = httpx.post(
            f"{urls[iid]}/engine/set_weight_version", json={"weight_version": "step-1"}, timeout=10
        )
        reply.raise_for_status()

    with Frontend(dep.frontend_url, model=MODEL, timeout=60) as frontend:
        completion = frontend.pinned_completion(
            PROMPT,
            instance_id=ids[0],
            policy_version="step-1",
            rollout_id="rollout-1",
            attempt_id="attempt-1",
            max_tokens=5,
            prompt_logprobs=1,
        )
        # An instance the frontend does not know is refused (400), never silently rerouted.
        with pytest.raises(GenerationError) as unknown:
            frontend.pinned_completion(
                PROMPT,
                instance_id=max(ids) + 1,
                policy_version="step-1",
                rollout_id="rollout-2",
                attempt_id="attempt-1",
                max_tokens=5,
            )
    assert unknown.value.status == 400

    reply = completion.reply
    assert reply["nvext"]["completion_token_ids"] == policy_tokens("step-1", PROMPT, 5)
    assert reply["nvext"]["worker_id"]["decode_worker_id"] == ids[0]
    assert reply["nvext"]["prompt_token_ids"] == PROMPT
    sample = Sample.from_completion(completion)
    verdict = admit(sample, completion.request, reply, view_of(tuple(ids), "step-1"))
    assert verdict.accepted, verdict.failures
    # The same real reply, judged against a gate at another version or without the instance.
    assert admit(sample, completion.request, reply, view_of(tuple(ids), "step-2")).failed_rules == (
        "admitted",
    )
    assert admit(sample, completion.request, reply, view_of((ids[1],), "step-1")).failed_rules == (
        "admitted",
    )
    guard = AdmissionGuard()
    assert guard.admit(sample, completion.request, reply, view_of(tuple(ids), "step-1")).accepted
    again = guard.admit(sample, completion.request, reply, view_of(tuple(ids), "step-1"))
    assert again.failed_rules == ("duplicate",)

    store_or_compare(
        "dynamo-1.6.1",
        completion,
        "ai-dynamo 1.6.1 frontend (/v1/completions) + scripted vLLM-style worker "
        "(tests/interop/programs/vllm_rl_worker.py) on the Dynamo runtime",
    )
