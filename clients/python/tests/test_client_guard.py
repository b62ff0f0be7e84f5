"""The guard, rule by rule, on real reply shapes: each test breaks exactly one rule of one
captured reply (simulated fleet and real Dynamo 1.6.1) and sees exactly that rule fail."""

from __future__ import annotations

import dataclasses

import pytest
from dynamo_rl_trainer import AdmissionGuard, Sample, admit
from dynamo_rl_trainer.generation import Completion


def sample_of(captured, reply=None) -> Sample:
    completion = Completion(captured.request, reply or captured.reply, sends=1, received_at=0)
    return Sample.from_completion(completion)


def failed(captured, *, sample=None, reply=None, view=None, request=None) -> tuple[str, ...]:
    reply = reply if reply is not None else captured.fresh_reply()
    verdict = admit(
        sample if sample is not None else sample_of(captured),
        request or captured.request,
        reply,
        view or captured.view(),
    )
    return verdict.failed_rules


def needs_prompt_logprobs(captured) -> None:
    if captured.request.prompt_logprobs is None:
        pytest.skip(f"{captured.name} was captured without prompt logprobs")


def test_the_captured_reply_is_accepted(captured):
    verdict = admit(sample_of(captured), captured.request, captured.fresh_reply(), captured.view())
    assert verdict.accepted, verdict.failures
    assert verdict.basis == "gate"


# -- token ids ---------------------------------------------------------------------------------
def test_a_changed_engine_id_fails_only_token_ids(captured):
    sample = sample_of(captured)
    reply = captured.fresh_reply()
    reply["nvext"]["completion_token_ids"][0] += 1
    assert failed(captured, sample=sample, reply=reply) == ("token_ids",)


def test_missing_completion_ids_fail_only_token_ids(captured):
    reply = captured.fresh_reply()
    del reply["nvext"]["completion_token_ids"]
    assert failed(captured, sample=sample_of(captured), reply=reply) == ("token_ids",)


def test_two_choices_fail_only_token_ids(captured):
    reply = captured.fresh_reply()
    reply["choices"].append(dict(reply["choices"][0], index=1))
    assert failed(captured, reply=reply) == ("token_ids",)


def test_an_echoed_prompt_that_is_not_the_request_fails_only_token_ids(captured):
    reply = captured.fresh_reply()
    assert reply["nvext"]["prompt_token_ids"] == list(captured.request.prompt_token_ids)
    reply["nvext"]["prompt_token_ids"] = reply["nvext"]["prompt_token_ids"][1:]
    assert failed(captured, reply=reply) == ("token_ids",)


# -- selected logprobs -------------------------------------------------------------------------
def test_a_sample_with_a_truncated_logprob_list_fails_only_selected_logprobs(captured):
    sample = sample_of(captured)
    sample = dataclasses.replace(sample, logprobs=sample.logprobs[:-1])
    assert failed(captured, sample=sample) == ("selected_logprobs",)


def test_reordered_sample_logprobs_fail_only_selected_logprobs(captured):
    sample = sample_of(captured)
    values = list(sample.logprobs)
    values[0], values[-1] = values[-1], values[0] - 0.25  # out of order, and not the engine's
    sample = dataclasses.replace(sample, logprobs=tuple(values))
    assert failed(captured, sample=sample) == ("selected_logprobs",)


def test_a_reply_logprob_list_shorter_than_the_ids_fails_only_selected_logprobs(captured):
    reply = captured.fresh_reply()
    block = reply["choices"][0]["logprobs"]
    block["token_logprobs"].pop()
    block["tokens"].pop()
    sample = sample_of(captured, reply)
    assert failed(captured, sample=sample, reply=reply) == ("selected_logprobs",)


def test_a_positive_logprob_fails_only_selected_logprobs(captured):
    reply = captured.fresh_reply()
    reply["choices"][0]["logprobs"]["token_logprobs"][0] = 0.5
    assert failed(captured, sample=sample_of(captured, reply), reply=reply) == (
        "selected_logprobs",
    )


# -- prompt logprobs ---------------------------------------------------------------------------
def test_shifted_prompt_logprobs_fail_only_prompt_logprobs(captured):
    needs_prompt_logprobs(captured)
    reply = captured.fresh_reply()
    entries = reply["nvext"]["prompt_logprobs"]
    reply["nvext"]["prompt_logprobs"] = [*entries[1:], None]  # lost the leading None
    assert failed(captured, sample=sample_of(captured), reply=reply) == ("prompt_logprobs",)


def test_a_sample_that_fills_the_undefined_position_fails_only_prompt_logprobs(captured):
    needs_prompt_logprobs(captured)
    sample = sample_of(captured)
    assert sample.prompt_logprobs[0] is None
    sample = dataclasses.replace(sample, prompt_logprobs=(0.0, *sample.prompt_logprobs[1:]))
    assert failed(captured, sample=sample) == ("prompt_logprobs",)


def test_missing_prompt_logprobs_fail_only_prompt_logprobs(captured):
    needs_prompt_logprobs(captured)
    reply = captured.fresh_reply()
    del reply["nvext"]["prompt_logprobs"]
    assert failed(captured, sample=sample_of(captured), reply=reply) == ("prompt_logprobs",)


# -- finish --------------------------------------------------------------------------------------
def test_a_cancelled_generation_fails_only_finish(captured):
    reply = captured.fresh_reply()
    reply["choices"][0]["finish_reason"] = "stop"  # what cancellation maps to
    reply["nvext"]["detailed_finish_reason"] = "cancelled"
    assert failed(captured, reply=reply) == ("finish",)


def test_stop_without_a_detailed_reason_fails_only_finish(captured):
    reply = captured.fresh_reply()
    reply["choices"][0]["finish_reason"] = "stop"
    reply["nvext"].pop("detailed_finish_reason", None)
    assert failed(captured, reply=reply) == ("finish",)


def test_an_unfinished_or_unrecognised_finish_fails_only_finish(captured):
    for finish in (None, "content_filter", "error"):
        reply = captured.fresh_reply()
        reply["choices"][0]["finish_reason"] = finish
        assert failed(captured, reply=reply) == ("finish",), finish


def test_a_stop_at_end_of_sequence_is_terminal(captured):
    reply = captured.fresh_reply()
    reply["choices"][0]["finish_reason"] = "stop"
    reply["nvext"]["detailed_finish_reason"] = "eos"
    assert failed(captured, reply=reply) == ()


# -- identity ------------------------------------------------------------------------------------
def test_a_reply_from_another_model_fails_only_identity(captured):
    reply = captured.fresh_reply()
    reply["model"] = "someone-elses-policy"
    assert failed(captured, reply=reply) == ("identity",)


def test_a_worker_registered_with_another_model_fails_only_identity(captured):
    assert failed(captured, view=captured.view(model="another-model")) == ("identity",)


def test_a_reply_served_by_another_admitted_instance_fails_only_identity(captured):
    other = captured.request.instance_id ^ 1
    reply = captured.fresh_reply()
    reply["nvext"]["worker_id"]["decode_worker_id"] = other
    reply["nvext"]["worker_id"]["prefill_worker_id"] = other
    view = captured.view(instances=(captured.request.instance_id, other))
    assert failed(captured, reply=reply, view=view) == ("identity",)


def test_a_tokenizer_mismatch_fails_only_identity(captured):
    view = captured.view()
    iid = captured.request.instance_id
    view._identities[iid] = dataclasses.replace(view._identities[iid], tokenizer="tok-a")
    sample = dataclasses.replace(sample_of(captured), tokenizer="tok-b")
    assert failed(captured, sample=sample, view=view) == ("identity",)


# -- admitted ------------------------------------------------------------------------------------
def test_a_gate_at_another_version_fails_only_admitted(captured):
    assert failed(captured, view=captured.view(version="base")) == ("admitted",)


def test_an_instance_outside_the_verified_set_fails_only_admitted(captured):
    other = captured.request.instance_id ^ 1
    assert failed(captured, view=captured.view(instances=(other,))) == ("admitted",)


def test_a_request_sent_before_the_gate_opened_fails_only_admitted(captured):
    view = captured.view(since=captured.request.sent_at + 1)
    assert failed(captured, view=view) == ("admitted",)


def test_a_closed_gate_fails_only_admitted(captured):
    assert failed(captured, view=captured.view(state="closed")) == ("admitted",)


def test_a_forced_gate_admits_only_when_allowed(captured):
    view = captured.view(state="open_forced")
    assert failed(captured, view=view) == ("admitted",)
    view.allow_forced = True
    assert failed(captured, view=view) == ()


def test_a_sample_stamped_with_another_version_fails_only_admitted(captured):
    sample = dataclasses.replace(sample_of(captured), policy_version="step-999")
    assert failed(captured, sample=sample) == ("admitted",)


# -- duplicates ----------------------------------------------------------------------------------
def test_a_second_reply_for_one_attempt_fails_only_duplicate(captured):
    guard = AdmissionGuard()
    view = captured.view()
    first = guard.admit(sample_of(captured), captured.request, captured.fresh_reply(), view)
    again = guard.admit(sample_of(captured), captured.request, captured.fresh_reply(), view)
    assert first.accepted
    assert again.failed_rules == ("duplicate",)
    assert guard.duplicates == 1


def test_a_rejected_attempt_does_not_block_its_accepted_retry(captured):
    guard = AdmissionGuard()
    bad = captured.fresh_reply()
    bad["model"] = "other"
    assert not guard.admit(sample_of(captured), captured.request, bad, captured.view()).accepted
    good = guard.admit(
        sample_of(captured), captured.request, captured.fresh_reply(), captured.view()
    )
    assert good.accepted
