"""Which operator actions each refresh state allows, where they lead, and what they refuse."""

from __future__ import annotations

import pytest

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.refresh import intents
from controlplane.refresh.errors import ApprovalNotAllowed, InvalidTransition, PlanBlocked
from controlplane.refresh.models import (
    EXECUTING_STATES,
    WAITING_STATES,
    Gate,
    GateState,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
)
from controlplane.refresh.step_order import STATE_STEP
from tests.unit.refresh.builders import DISK

S = RefreshState
ACTOR = Actor.system("transition test")
ALL = list(S)


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="fleet-a", listener_url="http://10.0.0.1:8001", allowed_networks=["10.0.0.0/8"]
    )


def refresh_in(source, state: str, **fields) -> PolicyRefresh:
    return PolicyRefresh.objects.create(
        source=source, namespaces=["rl-a"], target=DISK, state=state, **fields
    )


def state_of(refresh) -> str:
    refresh.refresh_from_db()
    return refresh.state


# -- start ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ALL)
def test_only_a_planned_refresh_starts(source, state):
    refresh = refresh_in(source, state)
    if state == S.PLANNED:
        intents.start_policy_refresh(refresh, actor=ACTOR, enqueue=False)
        assert state_of(refresh) == S.GATING
        assert ScopeLock.objects.filter(refresh=refresh, namespace="rl-a").exists()
    else:
        with pytest.raises(InvalidTransition):
            intents.start_policy_refresh(refresh, actor=ACTOR, enqueue=False)
        assert state_of(refresh) == state


def test_a_planned_refresh_with_blockers_does_not_start(source):
    refresh = refresh_in(source, S.PLANNED, plan_blockers=["no live workers in the chosen scope"])
    with pytest.raises(PlanBlocked):
        intents.start_policy_refresh(refresh, actor=ACTOR, enqueue=False)
    assert state_of(refresh) == S.PLANNED and not ScopeLock.objects.exists()


def test_a_source_that_requires_approval_waits_for_it(source):
    source.require_approval = True
    source.save()
    refresh = refresh_in(source, S.PLANNED)
    intents.start_policy_refresh(refresh, actor=ACTOR, enqueue=False)
    assert state_of(refresh) == S.AWAITING_APPROVAL


# -- approve / reject -----------------------------------------------------------------------------


@pytest.mark.parametrize("state", [s for s in ALL if s != S.AWAITING_APPROVAL])
def test_only_an_awaiting_refresh_is_approved_or_rejected(source, approver, state):
    refresh = refresh_in(source, state)
    with pytest.raises(ApprovalNotAllowed):
        intents.approve_policy_refresh(refresh, actor=Actor.for_user(approver), enqueue=False)
    with pytest.raises(ApprovalNotAllowed):
        intents.reject_policy_refresh(refresh, actor=Actor.for_user(approver), reason="no")
    assert state_of(refresh) == state


def test_approval_starts_and_rejection_ends(source, operator, approver):
    approved = refresh_in(source, S.AWAITING_APPROVAL, requested_by=operator)
    intents.approve_policy_refresh(approved, actor=Actor.for_user(approver), enqueue=False)
    assert state_of(approved) == S.GATING

    rejected = refresh_in(source, S.AWAITING_APPROVAL, requested_by=operator)
    intents.reject_policy_refresh(rejected, actor=Actor.for_user(approver), reason="not now")
    assert state_of(rejected) == S.REJECTED


def test_the_requester_cannot_approve_their_own_refresh(source, approver):
    refresh = refresh_in(source, S.AWAITING_APPROVAL, requested_by=approver)
    with pytest.raises(ApprovalNotAllowed):
        intents.approve_policy_refresh(refresh, actor=Actor.for_user(approver), enqueue=False)
    assert state_of(refresh) == S.AWAITING_APPROVAL


# -- abort ----------------------------------------------------------------------------------------

ABORT_ENDS_AT_ONCE = {S.PLANNED, S.AWAITING_APPROVAL}
ABORT_NOW = EXECUTING_STATES - {S.RELEASING, S.ABORTING}


@pytest.mark.parametrize("resume", [False, True], ids=["hold", "resume"])
@pytest.mark.parametrize("state", ALL)
def test_abort(source, state, resume):
    refresh = refresh_in(source, state)
    if state in ABORT_ENDS_AT_ONCE:
        intents.abort_policy_refresh(refresh, actor=ACTOR, resume_engines=resume)
        assert state_of(refresh) == S.ABORTED
    elif state in ABORT_NOW:
        intents.abort_policy_refresh(refresh, actor=ACTOR, resume_engines=resume)
        # Aborting until the executor has cancelled its calls and confirms.
        assert state_of(refresh) == S.ABORTING and refresh.abort_requested
        assert refresh.end_state == (S.ABORTED if resume else "")
        assert refresh.failed_step == STATE_STEP[state]
    elif state == S.AWAITING_APPLY and not resume:
        # Waiting for the trainer's applied report, its workers paused: it holds with them.
        intents.abort_policy_refresh(refresh, actor=ACTOR, resume_engines=resume)
        assert state_of(refresh) == S.HELD and refresh.failed_step == "update"
    elif (state == S.HELD and resume) or state in WAITING_STATES:
        # Waiting between waves nothing it paused is left to keep paused: both abort the same.
        intents.abort_policy_refresh(refresh, actor=ACTOR, resume_engines=resume)
        assert state_of(refresh) == S.RELEASING and refresh.end_state == S.ABORTED
    else:
        with pytest.raises(InvalidTransition):
            intents.abort_policy_refresh(refresh, actor=ACTOR, resume_engines=resume)
        assert state_of(refresh) == state and not refresh.abort_requested


# -- retry and rollback ---------------------------------------------------------------------------


@pytest.mark.parametrize("state", ALL)
def test_only_a_held_refresh_is_retried_from_its_failed_step(source, state):
    refresh = refresh_in(source, state, failed_step="update", held_reason="update failed")
    if state == S.HELD:
        intents.retry_policy_refresh(refresh, actor=ACTOR)
        assert state_of(refresh) == S.UPDATING and refresh.held_reason == ""
    else:
        with pytest.raises(InvalidTransition):
            intents.retry_policy_refresh(refresh, actor=ACTOR)
        assert state_of(refresh) == state


def test_a_held_refresh_without_a_failed_step_is_not_retried(source):
    refresh = refresh_in(source, S.HELD)
    with pytest.raises(InvalidTransition):
        intents.retry_policy_refresh(refresh, actor=ACTOR)


@pytest.mark.parametrize("state", [s for s in ALL if s != S.HELD])
def test_only_a_held_refresh_is_rolled_back(source, state):
    with pytest.raises(InvalidTransition):
        intents.rollback_policy_refresh(refresh_in(source, state), actor=ACTOR)


def test_a_held_refresh_with_nothing_verified_has_no_rollback(source):
    refresh = refresh_in(source, S.HELD, failed_step="verify")
    with pytest.raises(InvalidTransition, match="no verified policy"):
        intents.rollback_policy_refresh(refresh, actor=ACTOR)
    assert state_of(refresh) == S.HELD


# -- force-reopen ---------------------------------------------------------------------------------


def test_an_open_gate_is_not_force_reopened(source):
    gate = Gate.objects.create(source=source, namespace="rl-a", state=GateState.OPEN)
    with pytest.raises(InvalidTransition, match="already open"):
        intents.force_reopen_gate(gate, actor=ACTOR, reason="why not")


@pytest.mark.parametrize("state", sorted(EXECUTING_STATES))
def test_a_gate_under_a_running_refresh_is_not_force_reopened(source, state):
    refresh = refresh_in(source, state)
    gate = Gate.objects.create(
        source=source, namespace="rl-a", state=GateState.CLOSED, active_refresh=refresh
    )
    wait = "ends aborted within seconds" if state == S.ABORTING else "abort it first"
    with pytest.raises(InvalidTransition, match=wait):
        intents.force_reopen_gate(gate, actor=ACTOR, reason="stuck")
    gate.refresh_from_db()
    assert not gate.is_open and state_of(refresh) == state


def test_force_reopen_releases_a_held_refresh_and_opens_the_gate(source):
    refresh = refresh_in(source, S.HELD, failed_step="verify")
    gate = Gate.objects.create(
        source=source, namespace="rl-a", state=GateState.CLOSED, active_refresh=refresh
    )
    intents.force_reopen_gate(gate, actor=ACTOR, reason="verified by hand")
    gate.refresh_from_db()
    assert gate.is_open and gate.active_refresh is None and gate.revision == 2
    assert state_of(refresh) == S.RELEASING and refresh.end_state == S.FAILED
