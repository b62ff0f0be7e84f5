"""A refresh's life as an operator drives it: start, approve, reject, abort, discard, retry, end.

Each writes its change and its audit rows in one transaction and enqueues the executor on
commit. Views, the JSON API, webhooks and the management command call these; they never write
refresh models themselves.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor
from controlplane.notify.emit import notify
from controlplane.refresh import abort_signal, gates, quarantine
from controlplane.refresh.drill_hold import held_by_drill_message, holding_drill, serialize_scope
from controlplane.refresh.errors import (
    ApprovalNotAllowed,
    InvalidTransition,
    PlanBlocked,
    RefreshConflict,
    wrong_state,
)
from controlplane.refresh.intents import base, external
from controlplane.refresh.intents.base import audit_refresh, locked_refresh, scope_conflict
from controlplane.refresh.intents.queries import ENDABLE_STATES, executor_alive, left_paused_keys
from controlplane.refresh.live import publish_state_on_commit
from controlplane.refresh.models import (
    EXECUTING_STATES,
    WAITING_STATES,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
)
from controlplane.refresh.step_order import STATE_STEP, STEP_STATE, StepName
from controlplane.textlimits import STATE_REASON_CHARS

__all__ = [
    "abort_policy_refresh",
    "approve_policy_refresh",
    "discard_policy_refresh",
    "end_policy_refresh",
    "reject_policy_refresh",
    "retry_policy_refresh",
    "start_policy_refresh",
]


def start_policy_refresh(
    refresh: PolicyRefresh, *, actor: Actor, enqueue: bool = True, require_approval: bool = False
) -> PolicyRefresh:
    """Take the scope (database-enforced) and run, or wait for approval where required.

    Approval is required when the source demands it or the caller asks (`require_approval`,
    e.g. a trainer webhook whose endpoint policy or metric rule says so).
    `enqueue=False` leaves execution to the caller (the management command runs in-process).
    """
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        if refresh.state != RefreshState.PLANNED:
            raise wrong_state(refresh, wanted="planned")
        if refresh.plan_blockers:
            raise PlanBlocked("the plan has blockers: " + "; ".join(refresh.plan_blockers))
        # Lock order: refresh row, then scope locks (sorted namespaces), audit chain head last.
        lockorder.domain_lock("scope locks")
        # A running drill holds its namespaces between its legs too (only its legs may start).
        serialize_scope(refresh.source_id)
        drill = holding_drill(refresh.source_id, refresh.namespaces, refresh_id=refresh.pk)
        if drill is not None:
            raise RefreshConflict(held_by_drill_message(drill, refresh.namespaces))
        try:
            with transaction.atomic():
                ScopeLock.objects.bulk_create(
                    ScopeLock(source=refresh.source, namespace=ns, refresh=refresh)
                    for ns in sorted(refresh.namespaces)
                )
        except IntegrityError:
            raise scope_conflict(refresh.source, refresh.namespaces) from None
        # One owner per worker (executor/handover.py): a catch-up running in the scope finishes
        # first; the conflict is transient (a trainer's webhook is retried).
        gates.lock_scope_gates(refresh.source, refresh.namespaces)
        catching_up = quarantine.running_catch_up(refresh.source, refresh.namespaces)
        if catching_up is not None:
            raise RefreshConflict(
                f"quarantine #{catching_up.pk} is catching up {catching_up.key} on "
                f"{refresh.source.name}/{catching_up.namespace}; start again once it ends"
            )
        needs_approval = refresh.source.require_approval or require_approval
        refresh.transition(
            RefreshState.AWAITING_APPROVAL if needs_approval else STEP_STATE[StepName.GATE]
        )
        audit_refresh(
            AuditAction.POLICY_REFRESH_REQUESTED, refresh, actor, needs_approval=needs_approval
        )
        if needs_approval:
            notify("refresh.awaiting_approval", refresh=refresh)
        else:
            audit_refresh(AuditAction.POLICY_REFRESH_STARTED, refresh, actor)
            if enqueue:
                base.enqueue_execution(refresh.pk)
    publish_state_on_commit(refresh)
    return refresh


def approve_policy_refresh(
    refresh: PolicyRefresh, *, actor: Actor, enqueue: bool = True
) -> PolicyRefresh:
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        if refresh.state != RefreshState.AWAITING_APPROVAL:
            raise ApprovalNotAllowed(f"policy refresh #{refresh.pk} is not awaiting approval")
        if actor.user is None or actor.user.pk == refresh.requested_by_id:
            raise ApprovalNotAllowed("the requester cannot approve their own policy refresh")
        refresh.transition(RefreshState.GATING, approved_by=actor.user, approved_at=timezone.now())
        audit_refresh(AuditAction.POLICY_REFRESH_APPROVED, refresh, actor)
        audit_refresh(AuditAction.POLICY_REFRESH_STARTED, refresh, actor)
        if enqueue:
            base.enqueue_execution(refresh.pk)
    publish_state_on_commit(refresh)
    return refresh


def reject_policy_refresh(refresh: PolicyRefresh, *, actor: Actor, reason: str) -> PolicyRefresh:
    if not reason or not reason.strip():
        raise ValidationError("a rejection needs a reason")
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        if refresh.state != RefreshState.AWAITING_APPROVAL:
            raise ApprovalNotAllowed(f"policy refresh #{refresh.pk} is not awaiting approval")
        if actor.user is not None and actor.user.pk == refresh.requested_by_id:
            raise ApprovalNotAllowed("the requester cannot reject their own policy refresh")
        refresh.transition(RefreshState.REJECTED, end_reason=reason.strip())
        gates.release_scope(refresh, "")
        audit_refresh(AuditAction.POLICY_REFRESH_REJECTED, refresh, actor, reason=reason.strip())
    publish_state_on_commit(refresh)
    return refresh


def abort_policy_refresh(
    refresh: PolicyRefresh, *, actor: Actor, resume_engines: bool = False
) -> PolicyRefresh:
    """Stop now. A running refresh moves to `aborting`: its executor cancels the calls in
    flight and confirms, ending `aborted` with its gates closed and what it paused left paused
    (named in the end reason), or, with `resume_engines`, resuming the engines it paused first
    (`executor/abort.py`). One with no executor running ends or releases at once."""
    reason = f"aborted by {actor.label}"
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        state = refresh.state
        if state == RefreshState.ABORTING:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is already aborting ({refresh.end_reason}): its "
                "executor is cancelling the calls in flight and ends it aborted within seconds"
            )
        if state in (RefreshState.PLANNED, RefreshState.AWAITING_APPROVAL):
            # Nothing touched yet: end at once.
            refresh.transition(RefreshState.ABORTED, end_reason=reason)
            gates.release_scope(refresh, "")
        elif state in EXECUTING_STATES and state != RefreshState.RELEASING:
            refresh.transition(
                RefreshState.ABORTING,
                abort_requested=True,
                end_reason=reason,
                end_state=RefreshState.ABORTED if resume_engines else "",
                failed_step=STATE_STEP[RefreshState(state)].value,
            )
            # The running step hears it through Redis within a fraction of a second, without a
            # query per beat; an executor between steps reads the state.
            abort_signal.send_on_commit(refresh.pk)
            gates.update_gate_reason(
                refresh,
                f"policy refresh #{refresh.pk} aborting ({reason}): cancelling its calls in flight",
            )
        elif state == RefreshState.AWAITING_APPLY and not resume_engines:
            # An external update waiting for the trainer: no executor, no call in flight; it
            # holds with its workers paused (the trainer may be applying the weights).
            external.abort_apply_wait(refresh, actor=actor)
        elif (state == RefreshState.HELD and resume_engines) or state in WAITING_STATES:
            # Waiting between waves, nothing it paused is left but the workers its failure
            # budget handed to quarantine (which stay paused): the release ends it cleanly.
            refresh.transition(
                RefreshState.RELEASING, end_state=RefreshState.ABORTED, end_reason=reason
            )
            base.enqueue_execution(refresh.pk)
        else:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is {state}; a held refresh is aborted by resuming "
                "its engines, or resolved by retry, rollback, force-reopen or ending it"
            )
        audit_refresh(
            AuditAction.POLICY_REFRESH_ABORTED,
            refresh,
            actor,
            resume_engines=resume_engines,
            previous_state=state,
            state=refresh.state,
        )
    publish_state_on_commit(refresh)
    return refresh


def discard_policy_refresh(
    refresh: PolicyRefresh, *, actor: Actor, reason: str = ""
) -> PolicyRefresh:
    """Throw away a plan that was never started, so it stops waiting to be confirmed.

    Only from `planned`: nothing was locked, gated or called, so the plan simply ends. It
    ends in the terminal state `aborted` (the model has no state of its own for it; the end
    reason and the `policy_refresh.discarded` audit event say it was discarded).
    """
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        if refresh.state != RefreshState.PLANNED:
            raise wrong_state(
                refresh,
                why="only a planned refresh that was never started can be discarded",
            )
        reason = (reason or "").strip()
        end_reason = f"plan discarded by {actor.label}" + (f": {reason}" if reason else "")
        refresh.transition(RefreshState.ABORTED, end_reason=end_reason[:STATE_REASON_CHARS])
        audit_refresh(AuditAction.POLICY_REFRESH_DISCARDED, refresh, actor, reason=reason)
    publish_state_on_commit(refresh)
    return refresh


def retry_policy_refresh(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """Re-run the failed step on failed or unreached workers only, then carry on."""
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        if refresh.state == RefreshState.ABORTING:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is aborting ({refresh.end_reason}); an aborted "
                "refresh is not retried: plan a new one (or roll back) once it is aborted"
            )
        if refresh.state == RefreshState.HELD and not refresh.failed_step:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is held with nothing to retry ("
                f"{refresh.held_reason or 'no failed step'}); roll back the scope or end it"
            )
        if refresh.state != RefreshState.HELD or not refresh.failed_step:
            raise wrong_state(refresh, wanted="held")
        step = StepName(refresh.failed_step)
        refresh.transition(STEP_STATE[step], held_reason="", abort_requested=False)
        audit_refresh(AuditAction.POLICY_REFRESH_RETRIED, refresh, actor, step=step.value)
        base.enqueue_execution(refresh.pk)
    publish_state_on_commit(refresh)
    return refresh


def end_policy_refresh(refresh: PolicyRefresh, *, actor: Actor, reason: str) -> PolicyRefresh:
    """Close a refresh out on an approver's written say-so, whatever its workers do.

    The way out that never depends on a worker answering: no call is made. The refresh ends
    `aborted` with the reason, its scope is free at once and its gates stay closed (force-reopen
    is a separate, deliberate act). Workers it paused are left as they are and named in the end
    reason and the audit event, so a person can look at them; the next refresh of the scope
    pauses and resumes them anyway.

    A refresh whose executor is alive must be aborted first (it stops at the next call
    boundary and holds); one whose executor died (lease expired or never claimed) can be ended
    directly. Ending bumps the fencing token, so a stalled executor can never write again.
    """
    if not reason or not reason.strip():
        raise ValidationError("ending a policy refresh needs a written reason")
    reason = reason.strip()
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        if refresh.state not in ENDABLE_STATES:
            raise wrong_state(
                refresh,
                why="only an active refresh ends",
            )
        if refresh.state == RefreshState.ABORTING and executor_alive(refresh):
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is aborting: its executor is cancelling the "
                "calls in flight and ends it aborted within seconds"
            )
        if refresh.state in EXECUTING_STATES and executor_alive(refresh):
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is running ({refresh.state}); abort it first "
                "(it cancels its calls in flight and ends aborted within seconds)"
            )
        left_paused = left_paused_keys(refresh)
        end_reason = f"ended by {actor.label}: {reason}"
        if left_paused:
            end_reason += (
                f" — {len(left_paused)} worker{'' if len(left_paused) == 1 else 's'} this refresh "
                f"paused left as they are ({', '.join(left_paused[:5])}"
                f"{', …' if len(left_paused) > 5 else ''})"
            )
        previous = refresh.state
        refresh.transition(
            RefreshState.ABORTED,
            end_reason=end_reason[:STATE_REASON_CHARS],
            end_state="",
            abort_requested=False,
            lease_token=F("lease_token") + 1,
            lease_owner="",
            lease_expires_at=None,
        )
        refresh.refresh_from_db()  # the new fencing token
        gates.release_scope(refresh, f"policy refresh #{refresh.pk} {end_reason}")
        audit_refresh(
            AuditAction.POLICY_REFRESH_ENDED,
            refresh,
            actor,
            reason=reason,
            previous_state=previous,
            failed_step=refresh.failed_step,
            left_paused=left_paused,
            gates="unchanged: closed gates stay closed",
        )
    publish_state_on_commit(refresh)
    return refresh
