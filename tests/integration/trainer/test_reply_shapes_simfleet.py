"""The simulated fleet's frontend answers a pinned token-id completion in the shape the
trainer library's guard accepts, and the stored fixture its unit tests read still has that
shape (`replies.store_or_compare`)."""

from __future__ import annotations

import time

from dynamo_rl_trainer import Frontend, Gate, GateView, admit
from dynamo_rl_trainer.guard import Sample
from dynamo_rl_trainer.results import AdmittedInstances, WorkerIdentity

from controlplane.simfleet import FleetConfig
from tests.integration.trainer.replies import store_or_compare

PROMPT = [5, 6, 7, 8, 9]


def view_admitting(instance_id: int, version: str, model: str) -> GateView:
    gate = Gate(
        source="sim",
        namespace="rl-a",
        state="open",
        open=True,
        verified_version=version,
        verified_instances=(instance_id,),
        since=time.time() - 60,
        reason="",
        revision=1,
        active_refresh_id=None,
    )
    identity = WorkerIdentity(instance_id=instance_id, namespace="rl-a", model=model)
    return GateView(AdmittedInstances(gate=gate, instances=(identity,)))


def test_a_pinned_simfleet_completion_is_admitted_and_matches_the_stored_fixture(
    simfleet_factory,
):
    fleet = simfleet_factory(
        FleetConfig.generate(workers=2, namespaces=("rl-a",), prefix="rl", seed=5, model="policy")
    )
    worker = fleet.workers()[0]
    fleet.set_version(worker["key"], "step-3")
    with Frontend(fleet.frontend_url, model="policy") as frontend:
        completion = frontend.pinned_completion(
            PROMPT,
            instance_id=worker["instance_id"],
            policy_version="step-3",
            rollout_id="r-1",
            attempt_id="a-1",
            max_tokens=6,
            prompt_logprobs=1,
        )
    reply = completion.reply
    assert reply["nvext"]["worker_id"]["decode_worker_id"] == worker["instance_id"]
    assert reply["nvext"]["prompt_token_ids"] == PROMPT
    assert reply["nvext"]["prompt_logprobs"][0] is None
    assert len(reply["nvext"]["prompt_logprobs"]) == len(PROMPT)

    verdict = admit(
        Sample.from_completion(completion),
        completion.request,
        reply,
        view_admitting(worker["instance_id"], "step-3", "policy"),
    )
    assert verdict.accepted, verdict.failures
    stored = store_or_compare("simfleet", completion, "controlplane.simfleet frontend")
    assert stored["request"]["prompt_logprobs"] == 1
