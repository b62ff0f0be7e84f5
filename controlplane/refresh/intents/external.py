"""An external update's wait for the trainer: its `applied` report, the deadline, and the hold.

After `refresh.ready_for_apply` (`executor/external.py`) the refresh waits in `awaiting_apply`,
its workers paused, with no executor. Then:

- `report_applied(refresh, actor=..., weight_version=..., instance_ids=None)` records the
  trainer's report (the `refresh.applied` webhook and `POST …/applied` call it), for the named
  instances of the announced set or for all of it. Once every worker of the set has reported,
  the refresh goes back to `updating` and the executor declares the version, reads it back,
  flushes, verifies and reopens. Idempotent: a report already recorded changes nothing and
  answers the refresh as it is (also after the refresh moved on).
- A report is refused (`ApplyRefused`, 409 with its code, audited, nothing changes) for another
  version than the refresh's (`weight_version_mismatch`), for instances outside the announced
  set (`instance_not_in_refresh`), or when the refresh does not wait for one
  (`not_awaiting_apply`).
- No full report before the deadline (`expire_apply_waits`, a beat task): the refresh holds at
  the update step naming the workers that never reported. They stay paused, owned by the held
  refresh, and the hold's exits apply (retry announces again, abort, rollback, end).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor
from controlplane.notify.emit import notify
from controlplane.refresh import gates
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.intents import base
from controlplane.refresh.intents.base import audit_refresh, locked_refresh
from controlplane.refresh.live import publish_state_on_commit
from controlplane.refresh.models import PolicyRefresh, RefreshState, WorkerStepResult
from controlplane.refresh.progress import (
    APPLY_ABORTED,
    APPLY_APPLIED,
    APPLY_AWAITING,
    APPLY_EXPIRED,
    ExternalApply,
    external_of,
    with_external,
)
from controlplane.refresh.step_order import StepName
from controlplane.textlimits import LABEL_CHARS, STATE_REASON_CHARS

SYSTEM = Actor.system("external update")
#: Workers named in a hold's reason before "(+n more)".
NAMED = 5


class ApplyRefused(InvalidTransition):
    """A trainer's `applied` report that does not fit the waiting refresh (409, nothing
    changes). `code` says which: `weight_version_mismatch`, `instance_not_in_refresh` or
    `not_awaiting_apply`."""

    code = "not_awaiting_apply"


def same_version(given: Any, planned: Any) -> bool:
    """A trainer may send a version as a number or as text (`7` for `"7"`)."""
    return given == planned or str(given) == str(planned)


def public_view(refresh: PolicyRefresh) -> dict[str, Any]:
    """The external update's wait as the trainer and the pages read it back."""
    external = external_of(refresh) or {}
    applied = external.get("applied") or {}
    workers = list(external.get("workers") or [])
    return {
        "refresh_id": refresh.pk,
        "refresh_state": refresh.state,
        "weight_version": refresh.weight_version,
        "state": external.get("state", ""),
        "attempt": external.get("attempt"),
        "requested_at": external.get("requested_at"),
        "deadline": external.get("deadline"),
        "workers": workers,
        "applied": sorted(str(a.get("instance_id") or k) for k, a in applied.items()),
        "missing": sorted(w["instance_id"] or w["key"] for w in workers if w["key"] not in applied),
        "reason": external.get("reason", ""),
    }


def _clean_ids(instance_ids: Iterable[Any] | None) -> list[str] | None:
    if instance_ids is None:
        return None
    return sorted({str(i).strip() for i in instance_ids})


def report_applied(
    refresh: PolicyRefresh,
    *,
    actor: Actor,
    weight_version: Any,
    instance_ids: Iterable[Any] | None = None,
    enqueue: bool = True,
) -> PolicyRefresh:
    """Record the trainer's `applied` report for `instance_ids` (None: every worker of the
    announced set); go on once all of them reported. Refused (`ApplyRefused`, audited, nothing
    changes) for another version, unknown instances, or a refresh that waits for none."""
    ids = _clean_ids(instance_ids)
    with transaction.atomic():
        locked = locked_refresh(refresh)
        external = external_of(locked)
        problem: ApplyRefused | None = None
        try:
            keys = _reported_keys(locked, external, weight_version, ids)
        except ApplyRefused as refused:
            problem = refused
        else:
            if keys and external is not None:
                _record(locked, external, keys, actor, ids, enqueue=enqueue)
    if problem is not None:
        # Audited after the refusal's own transaction ended, so raising does not roll it back.
        audit_refresh(
            AuditAction.POLICY_REFRESH_APPLIED_REFUSED,
            locked,
            actor,
            weight_version=weight_version,
            instance_ids=ids,
            code=problem.code,
            reason=problem.message,
        )
        raise problem
    publish_state_on_commit(locked)
    return locked


def _reported_keys(
    refresh: PolicyRefresh,
    external: ExternalApply | None,
    weight_version: Any,
    ids: list[str] | None,
) -> list[str]:
    """The worker keys this report adds (empty: already recorded); raises `ApplyRefused`."""
    if refresh.target.get("method") != "external" or external is None:
        raise ApplyRefused(
            f"policy refresh #{refresh.pk} is not an external update waiting for the trainer "
            f"(state {refresh.state}, method {refresh.target.get('method')!r})"
        )
    if not same_version(weight_version, refresh.weight_version):
        raise ApplyRefused(
            f"policy refresh #{refresh.pk} is to {refresh.weight_version!r}, not "
            f"{weight_version!r}: the report is about another checkpoint",
            code="weight_version_mismatch",
        )
    workers = list(external.get("workers") or [])
    by_id = {w["instance_id"]: w["key"] for w in workers if w["instance_id"]}
    if ids is None:
        named = [w["key"] for w in workers]
    else:
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            raise ApplyRefused(
                f"instance(s) {', '.join(unknown[:NAMED])} are not among the workers policy "
                f"refresh #{refresh.pk} announced (attempt {external.get('attempt')}): "
                f"{', '.join(sorted(by_id)[:NAMED]) or 'none with an instance id'}",
                code="instance_not_in_refresh",
            )
        named = [by_id[i] for i in ids]
    applied = external.get("applied") or {}
    new = [key for key in named if key not in applied]
    if not new:
        return []  # a repeat: recorded already, whatever happened since
    if refresh.state != RefreshState.AWAITING_APPLY or external.get("state") != APPLY_AWAITING:
        raise ApplyRefused(
            f"policy refresh #{refresh.pk} is {refresh.state}; it waits for no applied report "
            f"(attempt {external.get('attempt')} is {external.get('state') or 'not announced'})"
        )
    return new


def _record(
    refresh: PolicyRefresh,
    external: ExternalApply,
    keys: list[str],
    actor: Actor,
    ids: list[str] | None,
    *,
    enqueue: bool,
) -> None:
    """Record the report on the locked refresh; all reported: back to `updating`."""
    now = timezone.now().isoformat()
    by = actor.label[:LABEL_CHARS]
    instance_of = {w["key"]: w["instance_id"] for w in external.get("workers") or []}
    applied = dict(external.get("applied") or {})
    for key in keys:
        applied[key] = {"at": now, "by": by, "instance_id": instance_of.get(key, "")}
    external = {**external, "applied": applied}
    complete = all(w["key"] in applied for w in external.get("workers") or [])
    if complete:
        external["state"] = APPLY_APPLIED
    progress = with_external(refresh, external)
    if complete:
        refresh.transition(RefreshState.UPDATING, progress=progress)
    else:
        refresh.progress = progress
        refresh.save(update_fields=["progress"])
    audit_refresh(
        AuditAction.POLICY_REFRESH_APPLIED,
        refresh,
        actor,
        weight_version=refresh.weight_version,
        attempt=external.get("attempt"),
        instance_ids=ids if ids is not None else "all",
        reported=len(applied),
        workers=len(external.get("workers") or []),
        complete=complete,
    )
    if complete and enqueue:
        base.enqueue_execution(refresh.pk)


def hold_apply_wait(refresh: PolicyRefresh, *, reason: str, actor: Actor, ended: str) -> None:
    """Hold a locked refresh waiting in `awaiting_apply` at its update step (the caller holds
    its row): the workers that never reported are named (their update step failed), stay
    paused and stay the held refresh's. `ended` is the apply record's end (expired, aborted)."""
    external = external_of(refresh) or {}
    applied = external.get("applied") or {}
    missing = [w for w in external.get("workers") or [] if w["key"] not in applied]
    names = [w["instance_id"] or w["key"] for w in missing]
    more = f" (+{len(names) - NAMED} more)" if len(names) > NAMED else ""
    if missing:
        reason = f"{reason}; no applied report from {len(missing)} of "
        reason += f"{len(external.get('workers') or [])} workers: {', '.join(names[:NAMED])}{more}"
    external = {**external, "state": ended, "reason": reason[:STATE_REASON_CHARS]}
    refresh.transition(
        RefreshState.HELD,
        progress=with_external(refresh, external),
        failed_step=StepName.UPDATE.value,
        held_reason=reason[:STATE_REASON_CHARS],
        abort_requested=False,
        end_state="",
    )
    now = timezone.now()
    planned = {w.key: w for w in refresh.workers.filter(key__in=[w["key"] for w in missing])}
    WorkerStepResult.objects.bulk_create(
        WorkerStepResult(
            refresh=refresh,
            planned_worker=planned[w["key"]],
            step=StepName.UPDATE,
            attempt=int(external.get("attempt") or 1),
            status="failed",
            error=f"no applied report from the trainer ({ended})",
            finished_at=now,
        )
        for w in missing
        if w["key"] in planned
    )
    # Lock order: gates before the audit chain head.
    gates.update_gate_reason(refresh, f"policy refresh #{refresh.pk} held: {reason}")
    audit_refresh(
        AuditAction.POLICY_REFRESH_STEP_FAILED,
        refresh,
        actor,
        step=StepName.UPDATE.value,
        reason=reason,
        failing_workers=[[w["key"], "no applied report"] for w in missing[:50]],
    )
    audit_refresh(
        AuditAction.POLICY_REFRESH_HELD, refresh, actor, step=StepName.UPDATE.value, reason=reason
    )
    notify("refresh.held", refresh=refresh, reason=reason)
    publish_state_on_commit(refresh)


def abort_apply_wait(refresh: PolicyRefresh, *, actor: Actor) -> None:
    """An abort (without resuming engines) of a locked refresh waiting for the report: it
    holds, as an executing refresh stops at its next call boundary and holds."""
    hold_apply_wait(refresh, reason=f"aborted by {actor.label}", actor=actor, ended=APPLY_ABORTED)


def deadline_of(refresh: PolicyRefresh) -> datetime | None:
    raw = (external_of(refresh) or {}).get("deadline")
    return datetime.fromisoformat(raw) if raw else None


def expire_apply_waits(now: datetime | None = None) -> list[int]:
    """Hold every external update whose `applied` report did not come (for all of its
    workers) before its deadline (a beat task). Returns the refreshes held."""
    now = now or timezone.now()
    held = []
    for refresh in PolicyRefresh.objects.filter(state=RefreshState.AWAITING_APPLY).order_by("id"):
        deadline = deadline_of(refresh)
        if deadline is None or deadline > now:
            continue
        with transaction.atomic():
            locked = locked_refresh(refresh)
            if locked.state != RefreshState.AWAITING_APPLY:
                continue  # the last report came meanwhile
            timeout = float((external_of(locked) or {}).get("timeout_s") or 0)
            hold_apply_wait(
                locked,
                reason=f"the trainer did not report applied within {timeout:g} s "
                f"(deadline {deadline.isoformat()})",
                actor=SYSTEM,
                ended=APPLY_EXPIRED,
            )
        held.append(refresh.pk)
    return held
