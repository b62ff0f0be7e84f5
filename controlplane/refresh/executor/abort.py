"""The executor's confirmation of an abort: from `aborting` to `aborted` (or to `releasing`).

`intents.abort_policy_refresh` moves a refresh whose executor runs to `aborting`; the executor
cancels the calls in flight (`cancellation`), journals them, and confirms here:

- without `resume_engines` (`end_state` blank): the refresh ends `aborted` at once. Its scope
  is free (a new plan, a rollback, an approver's force-reopen may follow), its gates stay
  closed, and the workers it paused and did not resume are named in the end reason and the
  audit event: they are left as they are for the recovery that follows.
- with `resume_engines` (`end_state` `aborted`): it moves to `releasing`; the release step
  resumes the engines it paused and ends `aborted` (`Runner._end_after_release`).

An executor that finds a refresh `aborting` with nothing in flight (it took the refresh over
from one that died: the reconciler resumed it) confirms the same way, so `aborting` always has
an exit.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import record
from controlplane.refresh import gates
from controlplane.refresh.departed import DEPARTED
from controlplane.refresh.executor.lease import Lease
from controlplane.refresh.executor.steps import EXECUTOR
from controlplane.refresh.models import (
    JournalEntry,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
    WorkerStepResult,
    state_change,
)
from controlplane.refresh.step_order import STATE_STEP, StepName
from controlplane.textlimits import STATE_REASON_CHARS

__all__ = ["aborted_step", "confirm_abort", "left_paused", "left_paused_keys"]

#: Workers named in an end reason (the audit event lists them all).
NAMED = 5


def aborted_step(refresh: PolicyRefresh) -> str:
    """The step the abort stopped: recorded when the abort was asked (`failed_step`), or the
    state's own step for a refresh flagged by an older version (state still the step's)."""
    step = STATE_STEP.get(RefreshState(refresh.state))
    return refresh.failed_step or (step.value if step is not None else "")


def left_paused(refresh: PolicyRefresh) -> QuerySet[PlannedWorker]:
    """Workers this refresh paused and has not resumed since (nor seen leave the fleet): one
    statement whatever the fleet's size, for the refresh page's "paused now" as much as for
    ending a refresh. The latest result per worker at resume/release decides whether it is
    running again."""
    latest_resume = (
        WorkerStepResult.objects.filter(
            planned_worker=OuterRef("pk"), step__in=(StepName.RESUME_ENGINES, StepName.RELEASE)
        )
        .order_by("-id")
        .values("status")[:1]
    )
    return (
        refresh.workers.filter(
            Exists(JournalEntry.objects.filter(planned_worker=OuterRef("pk"), step=StepName.PAUSE)),
            ~Exists(
                WorkerStepResult.objects.filter(planned_worker=OuterRef("pk"), status=DEPARTED)
            ),
        )
        .annotate(resumed=Coalesce(Subquery(latest_resume), Value("")))
        .exclude(resumed="ok")
    )


def left_paused_keys(refresh: PolicyRefresh) -> list[str]:
    """The keys of `left_paused` workers, sorted."""
    return sorted(left_paused(refresh).values_list("key", flat=True))


def cancelled_calls(refresh: PolicyRefresh) -> dict[str, int]:
    """How many of the refresh's calls aborts cancelled, and how many of those had reached
    their worker (the journal's record)."""
    return JournalEntry.objects.filter(refresh=refresh, cancelled=True).aggregate(
        cancelled=Count("pk"), reached=Count("pk", filter=Q(reached=True))
    )


def confirm_abort(lease: Lease, refresh: PolicyRefresh, *, stopped: str = "") -> str:
    """Confirm the abort of `refresh` (fenced by `lease`); returns the state it moved to.

    `stopped` is what the abort stopped in the running step ("2 calls cancelled (1 had
    reached the worker)"); it follows the abort's "aborted by <who>" in the reason."""
    step = aborted_step(refresh)
    asked = refresh.end_reason or "aborted by an operator"
    reason = f"{asked}: {stopped}" if stopped else asked
    calls = cancelled_calls(refresh)
    if refresh.end_state == RefreshState.ABORTED:
        with transaction.atomic(durable=True):
            lease.guard(
                **state_change(
                    RefreshState.RELEASING,
                    abort_requested=False,
                    failed_step=step,
                    end_reason=reason[:STATE_REASON_CHARS],
                )
            )
            record(
                AuditAction.POLICY_REFRESH_STEP_FAILED,
                actor=EXECUTOR,
                target=refresh,
                details={"step": step, "reason": reason, "aborted": True, **calls},
                correlation_id=refresh.correlation_id,
            )
        return RefreshState.RELEASING
    left = left_paused_keys(refresh)
    end_reason = reason
    if left:
        end_reason += (
            f" — {len(left)} worker{'' if len(left) == 1 else 's'} this refresh paused left "
            f"paused ({', '.join(left[:NAMED])}{', …' if len(left) > NAMED else ''})"
        )
    with transaction.atomic(durable=True):
        lease.release(
            **state_change(
                RefreshState.ABORTED,
                abort_requested=False,
                end_state="",
                failed_step=step,
                end_reason=end_reason[:STATE_REASON_CHARS],
            )
        )
        # Lock order: scope locks and gates before the audit chain head. Gates stay closed.
        gates.release_scope(refresh, f"policy refresh #{refresh.pk} aborted: {end_reason}")
        record(
            AuditAction.POLICY_REFRESH_ABORTED,
            actor=EXECUTOR,
            target=refresh,
            details={
                "reason": end_reason,
                "step": step,
                "engines_resumed": False,
                "left_paused": left,
                "cancelled_calls": calls["cancelled"],
                "cancelled_reached": calls["reached"],
            },
            correlation_id=refresh.correlation_id,
        )
    return RefreshState.ABORTED
