"""The verify step tells wrong weights from right ones, over a simulated fleet.

Every test here runs a real policy refresh (plan → gate → pause → update → resume → verify →
reopen) against the simulated Dynamo fleet, whose frontend generates deterministic greedy
completions per weight version.
"""

from __future__ import annotations

import pytest

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    Gate,
    JournalEntry,
    PlannedWorker,
    RefreshState,
    StepRun,
    WorkerStepResult,
)
from controlplane.simfleet import Fault
from controlplane.simfleet.tokens import (
    completion_logprobs,
    expected_completion_ids,
    jittered_completion,
)
from tests.integration.refresh.helpers import actor_for, fleet_config, make_source, run_inline

pytestmark = pytest.mark.django_db

PROMPT = [5, 6, 7, 8]


@pytest.fixture
def fleet(simfleet_factory):
    # Four vLLM workers over rl-a, rl-b, rl-c (rl-a has two), all serving `sim-model`.
    return simfleet_factory(fleet_config(4))


def key_of(fleet, index: int) -> str:
    return fleet.workers()[index]["key"]


def identity_of(fleet, key: str) -> str:
    return next(w["identity"] for w in fleet.workers() if w["key"] == key)


def assert_held_at_verify(refresh, source):
    assert refresh.state == RefreshState.HELD, refresh.state
    assert refresh.failed_step == "verify"
    gates = Gate.objects.filter(source=source)
    assert gates.exists() and not any(g.is_open for g in gates)


def verify_detail(refresh) -> str:
    return StepRun.objects.filter(refresh=refresh, name="verify").latest("id").detail


def latest_verify_status(refresh) -> dict[str, str]:
    latest: dict[str, str] = {}
    for key, status in (
        WorkerStepResult.objects.filter(refresh=refresh, step="verify")
        .order_by("id")
        .values_list("planned_worker__key", "status")
    ):
        latest[key] = status
    return latest


# -- cross-worker agreement -----------------------------------------------------------------------


def test_one_worker_with_wrong_tokens_holds_the_refresh_and_is_named(fleet, operator):
    source = make_source(fleet)
    bad = key_of(fleet, 2)
    fleet.inject(bad, "generate", Fault.wrong_tokens())

    refresh = run_inline(source, operator, "v2")

    assert_held_at_verify(refresh, source)
    bad_identity = identity_of(fleet, bad)
    assert "workers disagree" in refresh.held_reason
    assert bad_identity in refresh.held_reason
    assert "(3 of 4 agree)" in refresh.held_reason
    good = expected_completion_ids("v2", PROMPT, 8)
    assert f"reference [{', '.join(str(i) for i in good)}]" in refresh.held_reason
    # Only the odd worker is failed; the journal says what it generated and what was expected.
    statuses = latest_verify_status(refresh)
    assert statuses.pop(bad_identity) == "failed"
    assert set(statuses.values()) == {"ok"}
    row = JournalEntry.objects.get(
        refresh=refresh, operation="agreement", planned_worker__key=bad_identity
    )
    assert not row.ok and row.error.startswith("agreement: differs at token 0")
    assert row.response_body["reference_ids"] == good
    assert row.response_body["got_ids"] != good
    held = AuditEvent.objects.get(
        correlation_id=refresh.correlation_id, action="policy_refresh.step_failed"
    )
    assert [bad_identity, row.error] in held.details["failing_workers"]


def test_all_workers_right_succeed_and_say_they_were_cross_checked(fleet, operator):
    source = make_source(fleet)
    refresh = run_inline(source, operator, "v2")

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert "sim-model: 4 workers agree (exact agreement on the first 8 tokens)" in verify_detail(
        refresh
    )
    summary = JournalEntry.objects.get(
        refresh=refresh, operation="agreement", planned_worker__isnull=True
    )
    assert summary.ok and summary.response_body["agreeing"] == 4
    assert all(g.is_open for g in Gate.objects.filter(source=source))


def test_a_single_worker_scope_is_reported_as_not_cross_checked(simfleet_factory, operator):
    fleet = simfleet_factory(fleet_config(1))
    source = make_source(fleet)
    refresh = run_inline(source, operator, "v2")

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert "sim-model: 1 worker, no cross-check" in verify_detail(refresh)


def test_two_workers_that_disagree_are_both_named(fleet, operator):
    source = make_source(fleet)
    rl_a = [w for w in fleet.workers() if w["namespace"] == "rl-a"]
    assert len(rl_a) == 2
    fleet.inject(rl_a[1]["key"], "generate", Fault.wrong_tokens())

    refresh = run_inline(source, operator, "v2", namespaces=["rl-a"])

    assert_held_at_verify(refresh, source)
    assert "no plurality" in refresh.held_reason
    for worker in rl_a:
        assert worker["identity"] in refresh.held_reason
    assert set(latest_verify_status(refresh).values()) == {"failed"}


def test_retry_after_the_fault_is_fixed_reverifies_only_the_odd_worker(fleet, operator):
    source = make_source(fleet)
    bad = key_of(fleet, 1)
    fleet.inject(bad, "generate", Fault.wrong_tokens())
    refresh = run_inline(source, operator, "v2")
    assert_held_at_verify(refresh, source)

    fleet.clear_faults(bad)
    calls_before = JournalEntry.objects.filter(refresh=refresh, operation="generation").count()
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    retried = JournalEntry.objects.filter(refresh=refresh, operation="generation")[calls_before:]
    assert [e.planned_worker.key for e in retried] == [identity_of(fleet, bad)]
    assert "4 workers agree" in verify_detail(refresh)


# -- exact versus logprob rule under numeric jitter -----------------------------------------------


def jitter_flip_position(version: str) -> int:
    good = expected_completion_ids(version, PROMPT, 8)
    flipped, _ = jittered_completion(version, PROMPT, 8, magnitude=0.002, flip_from=1, seed="any")
    return next(i for i, (a, b) in enumerate(zip(good, flipped, strict=True)) if a != b)


def test_a_near_tie_flip_holds_under_the_exact_rule(fleet, operator):
    # Precondition: the simulated near-tie falls inside the 8-token window.
    assert jitter_flip_position("v4") < 8
    source = make_source(fleet)
    jittery = key_of(fleet, 3)
    fleet.inject(jittery, "generate", Fault.logprob_jitter(0.002, flip_from=1))

    refresh = run_inline(source, operator, "v4")

    assert_held_at_verify(refresh, source)
    assert identity_of(fleet, jittery) in refresh.held_reason
    assert f"differs at token {jitter_flip_position('v4')}" in refresh.held_reason


def test_the_logprob_rule_tolerates_the_same_jitter(fleet, operator):
    source = make_source(fleet, agreement_rule="logprob", agreement_epsilon=0.01)
    fleet.inject(key_of(fleet, 3), "generate", Fault.logprob_jitter(0.002, flip_from=1))
    fleet.inject(key_of(fleet, 0), "generate", Fault.logprob_jitter(0.002))

    refresh = run_inline(source, operator, "v4")

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert "chosen-token logprobs within 0.01 over the first 8 tokens" in verify_detail(refresh)


def test_the_logprob_rule_still_holds_wrong_tokens(fleet, operator):
    source = make_source(fleet, agreement_rule="logprob", agreement_epsilon=0.01)
    bad = key_of(fleet, 0)
    fleet.inject(bad, "generate", Fault.wrong_tokens())

    refresh = run_inline(source, operator, "v4")

    assert_held_at_verify(refresh, source)
    assert identity_of(fleet, bad) in refresh.held_reason


# -- trainer fingerprint --------------------------------------------------------------------------


def test_a_matching_trainer_fingerprint_succeeds(fleet, operator):
    source = make_source(fleet)
    ids = expected_completion_ids("v2", PROMPT, 6)
    fingerprint = {"completion_token_ids": ids, "logprobs": completion_logprobs(ids)}

    refresh = run_inline(source, operator, "v2", fingerprint=fingerprint)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert refresh.fingerprint == {**fingerprint, "logprob_tolerance": 0.05}
    generation = PlannedWorker.objects.filter(refresh=refresh).first().calls["verify"][-1]
    assert generation["fingerprint"] == refresh.fingerprint


def test_a_fingerprint_that_does_not_match_holds_naming_every_worker(fleet, operator):
    # The whole fleet agrees with itself, but not with what the trainer says it trained:
    # cross-worker agreement alone would pass this.
    source = make_source(fleet)
    expected = expected_completion_ids("v1", PROMPT, 4)  # the previous policy's output

    refresh = run_inline(source, operator, "v2", fingerprint={"completion_token_ids": expected})

    assert_held_at_verify(refresh, source)
    got = expected_completion_ids("v2", PROMPT, 4)
    assert "verify failed on 4 of 4 workers" in refresh.held_reason
    assert (
        f"trainer fingerprint: completion differs at token 0: expected "
        f"[{', '.join(map(str, expected))}], got [{', '.join(map(str, got))}]"
    ) in refresh.held_reason
    assert set(latest_verify_status(refresh).values()) == {"failed"}


def test_a_fingerprint_catches_the_one_worker_with_wrong_tokens(fleet, operator):
    source = make_source(fleet)
    bad = key_of(fleet, 2)
    fleet.inject(bad, "generate", Fault.wrong_tokens())
    expected = expected_completion_ids("v2", PROMPT, 8)

    refresh = run_inline(source, operator, "v2", fingerprint={"completion_token_ids": expected})

    assert_held_at_verify(refresh, source)
    assert "verify failed on 1 of 4 workers" in refresh.held_reason
    assert f"{identity_of(fleet, bad)}: generation: trainer fingerprint" in refresh.held_reason


def test_reference_logprobs_outside_the_tolerance_hold(fleet, operator):
    source = make_source(fleet)
    ids = expected_completion_ids("v2", PROMPT, 4)
    shifted = [lp - 0.2 for lp in completion_logprobs(ids)]

    refresh = run_inline(
        source,
        operator,
        "v2",
        fingerprint={"logprobs": shifted, "logprob_tolerance": 0.05},
    )

    assert_held_at_verify(refresh, source)
    assert "trainer fingerprint: logprob at token 0" in refresh.held_reason
    assert "> tolerance 0.05" in refresh.held_reason


def test_a_fingerprint_may_bring_its_own_prompt(fleet, operator):
    source = make_source(fleet)
    prompt = [42, 43]
    expected = expected_completion_ids("v2", prompt, 3)

    refresh = run_inline(
        source,
        operator,
        "v2",
        fingerprint={"prompt_token_ids": prompt, "completion_token_ids": expected},
    )

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    sent = JournalEntry.objects.filter(refresh=refresh, operation="generation").first()
    assert sent.request_body["prompt"] == prompt


def test_the_refresh_page_names_the_odd_worker_and_the_rule(fleet, operator, client):
    source = make_source(fleet)
    bad = key_of(fleet, 0)
    fleet.inject(bad, "generate", Fault.wrong_tokens())
    refresh = run_inline(source, operator, "v2")
    assert_held_at_verify(refresh, source)

    client.force_login(operator)
    page = client.get(f"/refreshes/{refresh.pk}/").content.decode()

    held = page.split('id="held-reason"', 1)[1].split("</p>", 1)[0]
    assert "workers disagree" in held and identity_of(fleet, bad) in held
    assert '<dd id="agreement-rule">exact agreement on the first 8 tokens</dd>' in page
    # The odd worker's verify cell carries the reason; the journal has the agreement rows.
    assert "agreement: differs at token 0" in page
    assert "cross-worker agreement on sim-model" in page


def test_the_replies_held_in_memory_are_the_journals_replies(fleet, operator):
    """The agreement check takes this attempt's replies from the verify step's own records
    instead of reading them back; what it compares must be exactly what the journal holds."""
    from controlplane.refresh.executor import agreement, steps

    seen: dict = {}
    original = agreement.verified_samples

    def spy(refresh, exclude=frozenset(), *, fresh=None):
        found = original(refresh, exclude, fresh=fresh)
        seen.update(fresh=fresh, found=found)
        return found

    source = make_source(fleet)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(agreement, "verified_samples", spy)
        refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert steps.Verify.run_jobs is not steps.WorkerStep.run_jobs
    # Every verified worker came from memory, none from a read of this attempt's rows ...
    assert len(seen["fresh"]) == 4

    # ... and reading everything back from the journal finds the same samples (the check
    # orders each model's workers itself, so the order they arrived in does not matter).
    def ordered(by_model):
        return {model: sorted(pairs) for model, pairs in by_model.items()}

    assert ordered(original(refresh)) == ordered(seen["found"])


def test_each_waves_agreement_compares_every_worker_verified_so_far(fleet, operator):
    """A wave's own replies come from memory; the earlier waves' are read back from the
    journal (same attempt, same executor), so the last wave's check covers the whole fleet."""
    source = make_source(fleet)
    refresh = run_inline(source, operator, "v2", strategy={"kind": "waves", "max_unavailable": 1})
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert refresh.waves > 1
    checks = list(
        JournalEntry.objects.filter(refresh=refresh, operation="agreement").order_by("id")
    )
    compared = [len(c.request_body["workers"]) for c in checks]
    assert compared == sorted(compared) and compared[-1] == 4, compared
