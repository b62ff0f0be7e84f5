"""The update step of an external refresh: announce, wait (no executor), declare and read back.

For frameworks that apply the weights themselves (verl's colocated CUDA IPC, NeMo RL's NCCL
refit): the control plane gates and pauses as for any method, then

1. **announces** `refresh.ready_for_apply` (notification, state event, `GET …/external`) with
   the worker set — instance ids, namespaces, admin URLs — and a deadline, and moves the
   refresh to `awaiting_apply`. The executor gives its lease up and ends: nothing waits in a
   thread. The trainer's `applied` report (`intents/external.py`) moves the refresh back to
   `updating` once every worker of the set reported; the beat task `expire_apply_waits` holds
   it past the deadline, naming the workers that never reported.
2. Run again after the report, the step **declares** the version where the worker advertises
   `set_weight_version` and **reads it back** (`get_weight_version`, expected to be the
   refresh's version); flush, resume, verify and reopen follow as for every method.

A retry of the held update step announces again (the next `attempt`) to the workers whose
update did not finish: their weights are the trainer's to apply again.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.notify.emit import notify
from controlplane.refresh.executor.journal import run_step_calls
from controlplane.refresh.executor.step_base import JobsStep, StepContext, StepResult
from controlplane.refresh.models import PlannedWorker, RefreshState, state_change
from controlplane.refresh.progress import (
    APPLY_APPLIED,
    APPLY_AWAITING,
    ApplyWorker,
    ExternalApply,
    external_of,
    with_external,
)

EXECUTOR = Actor.system("policy-refresh executor")


def apply_worker(worker: PlannedWorker) -> ApplyWorker:
    return {
        "instance_id": worker.instance_id,
        "namespace": worker.namespace,
        "key": worker.key,
        "family": worker.family,
        "system_url": worker.system_url,
    }


def reported_by_all(external: ExternalApply | None, workers: list[PlannedWorker]) -> bool:
    """Every one of `workers` is in the current announcement and reported `applied`."""
    if not external or external.get("state") != APPLY_APPLIED:
        return False
    announced = {w["key"] for w in external.get("workers", [])}
    applied = set(external.get("applied", {}))
    return all(w.key in announced and w.key in applied for w in workers)


def run_external_update(step: JobsStep, ctx: StepContext, pending: list[PlannedWorker]):
    """Announce and wait, or (after every report) declare and read the version back."""
    refresh = ctx.refresh
    external = external_of(refresh)
    if not reported_by_all(external, pending):
        return announce(ctx, pending)
    jobs = [step.job(ctx, w) for w in pending if w.calls.get(step.name)]
    for job in jobs:
        job.expect_version = refresh.weight_version
    journal = run_step_calls(ctx.lease, step.name, ctx.attempt, jobs, ctx.cfg)
    judged = step.judge(journal, len(jobs))
    if not judged.ok or judged.aborted:
        return judged
    declared = len(jobs)
    return StepResult(
        True,
        detail=f"{len(pending)} workers applied by the trainer (report "
        f"{(external or {}).get('attempt', 1)}); version declared and read back on "
        f"{declared}",
    )


def announce(ctx: StepContext, pending: list[PlannedWorker]) -> StepResult:
    """Publish `refresh.ready_for_apply` and move to `awaiting_apply`, giving the lease up."""
    refresh = ctx.refresh
    previous = external_of(refresh) or {}
    timeout = float(refresh.target.get("apply_timeout_s") or settings.REFRESH_APPLY_TIMEOUT_SECONDS)
    now = timezone.now()
    deadline = now + timedelta(seconds=timeout)
    external: ExternalApply = {
        "attempt": int(previous.get("attempt") or 0) + 1,
        "state": APPLY_AWAITING,
        "requested_at": now.isoformat(),
        "deadline": deadline.isoformat(),
        "timeout_s": timeout,
        "workers": [apply_worker(w) for w in pending],
        "applied": {},
        "reason": "",
    }
    progress = with_external(refresh, external)
    detail = (
        f"refresh.ready_for_apply sent for {len(pending)} paused workers (attempt "
        f"{external['attempt']}); waiting for the trainer's applied report until "
        f"{deadline.isoformat()}"
    )
    with transaction.atomic(durable=True):
        # Nobody runs while it waits: the lease goes, and the reconciler leaves it alone.
        ctx.lease.release(**state_change(RefreshState.AWAITING_APPLY, progress=progress))
        refresh.state = RefreshState.AWAITING_APPLY
        refresh.progress = progress
        record(
            AuditAction.POLICY_REFRESH_READY_FOR_APPLY,
            actor=EXECUTOR,
            target=refresh,
            details={
                "weight_version": refresh.weight_version,
                "attempt": external["attempt"],
                "deadline": external["deadline"],
                "workers": [w["instance_id"] or w["key"] for w in external["workers"]],
            },
            correlation_id=refresh.correlation_id,
        )
        notify("refresh.ready_for_apply", refresh=refresh, reason=detail)
    return StepResult(True, detail=detail, waiting=True)
