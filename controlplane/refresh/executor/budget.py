"""The failure budget (`Strategy.max_failed`): workers that may fail without holding the scope.

When a worker step fails on some workers and the refresh's budget still covers them, those
workers are left out instead of holding the refresh: each gets a `left_out` result at the step
(no later step calls it), is paused again where it was already serving (a failed verify runs
after the resume), and is handed to the quarantine machinery as a `failed` quarantine naming
the step and error — paused, out of the verified set, with `retry` (catch up to the refresh's
policy once the gate stands for it), `release` and `drop` as its exits. The gate lists them in
`instance_sets.left_out` while the refresh runs and as `left_out` drift entries once it opens,
so trainers always see how many are left out and why. The step then runs again for the rest.

Departures (workers that left the fleet) count against the same budget. A canary wave never
draws on it: a canary is judged whole. Over budget, the refresh holds as it always did.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import record
from controlplane.dynamo.families import UpdateMethod
from controlplane.refresh import gates
from controlplane.refresh.executor.calls import WorkerJob
from controlplane.refresh.executor.departures import (
    EXECUTOR,
    LEFT_OUT,
    departed_ids,
    left_out_ids,
)
from controlplane.refresh.executor.journal import run_step_calls
from controlplane.refresh.executor.waves import by_namespace, is_canary_wave
from controlplane.refresh.models import (
    OPEN_QUARANTINE_STATES,
    PlannedWorker,
    PolicyRefresh,
    Quarantine,
    QuarantineState,
    WorkerStepResult,
)
from controlplane.refresh.sequence import StepName
from controlplane.refresh.strategy import stored

#: The quarantine kind (and gate drift kind) of a worker left out by a refresh's budget.
KIND = gates.LEFT_OUT_KIND
#: Steps after which the failed worker may be serving again and is paused once more.
SERVING_AFTER = (StepName.RESUME_ENGINES, StepName.VERIFY)


def allowed(refresh: PolicyRefresh) -> int:
    """How many workers the budget covers (a percentage of the planned workers)."""
    return stored(refresh).max_failed.of(refresh.workers.count())


def used(refresh: PolicyRefresh) -> int:
    return len(left_out_ids(refresh.pk) | departed_ids(refresh.pk))


def describe(refresh: PolicyRefresh) -> str:
    return f"failure budget {used(refresh)} of {allowed(refresh)} used"


def absorb(ctx, step: StepName) -> tuple[bool, str]:
    """Leave out the workers that failed `step` in this attempt, if the budget covers them.

    Returns (absorbed, note): absorbed means the step should run again for the rest; the note
    says what was done, or why the budget could not cover the failures (for the hold reason).
    """
    refresh: PolicyRefresh = ctx.refresh
    budget = allowed(refresh)
    if budget == 0 or step not in (
        StepName.PAUSE,
        StepName.UPDATE,
        StepName.FLUSH,
        StepName.RESUME_ENGINES,
        StepName.VERIFY,
    ):
        return False, ""
    if refresh.target.get("method") == UpdateMethod.DISTRIBUTED:
        return False, ""
    if is_canary_wave(refresh):
        return False, "a canary is judged whole: the failure budget does not cover it"
    failing_ids = set(
        WorkerStepResult.objects.filter(
            refresh=refresh, step=step, attempt=ctx.attempt, status="failed"
        ).values_list("planned_worker_id", flat=True)
    )
    errors = dict(
        WorkerStepResult.objects.filter(
            refresh=refresh, step=step, attempt=ctx.attempt, status="failed"
        ).values_list("planned_worker_id", "error")
    )
    failing = [w for w in refresh.workers.all() if w.pk in failing_ids]
    if not failing:
        return False, ""
    spent = used(refresh)
    if spent + len(failing) > budget:
        return False, (
            f"over the failure budget: {len(failing)} failed now, {spent} already out, "
            f"{budget} allowed"
        )
    if step in SERVING_AFTER:
        paused = repause(ctx, failing)
    else:
        # A failed pause leaves it serving the old policy; after update or flush it is paused.
        paused = {w.pk: step != StepName.PAUSE for w in failing}
    leave_out(ctx, step, failing, errors, paused)
    return True, (
        f"{len(failing)} worker(s) left out by the failure budget "
        f"({spent + len(failing)} of {budget} used); the step runs again for the rest"
    )


def repause(ctx, workers: list[PlannedWorker]) -> dict[int, bool]:
    """Pause again the failed workers that may be serving; per worker, whether it worked."""
    jobs = [
        WorkerJob(
            planned_worker_id=w.pk,
            key=w.key,
            system_url=w.system_url,
            family=w.family,
            calls=w.calls.get(StepName.PAUSE, []),
        )
        for w in workers
        if w.calls.get(StepName.PAUSE)
    ]
    journal = run_step_calls(ctx.lease, StepName.PAUSE, ctx.attempt, jobs, ctx.cfg)
    done = {o.planned_worker_id for o in journal.outcomes if o.status == "ok"}
    return {w.pk: w.pk in done for w in workers}


def leave_out(
    ctx,
    step: StepName,
    workers: list[PlannedWorker],
    errors: dict[int, str],
    paused: dict[int, bool],
) -> None:
    refresh: PolicyRefresh = ctx.refresh
    now = timezone.now()
    reasons = {
        w.pk: (f"failed {step.value} in policy refresh #{refresh.pk}: {errors.get(w.pk, '')}")[
            :2000
        ]
        for w in workers
    }
    with transaction.atomic():
        ctx.lease.guard()
        WorkerStepResult.objects.bulk_create(
            WorkerStepResult(
                refresh=refresh,
                planned_worker=w,
                step=step,
                attempt=ctx.attempt,
                status=LEFT_OUT,
                error=reasons[w.pk],
                finished_at=now,
            )
            for w in workers
        )
        gates.wave_left_out(
            refresh,
            by_namespace(workers),
            reason=f"policy refresh #{refresh.pk}: {len(workers)} worker(s) left out by the "
            f"failure budget at {step.value}",
        )
        opened = open_quarantines(refresh, workers, reasons, paused)
        record(
            AuditAction.POLICY_REFRESH_WORKERS_LEFT_OUT,
            actor=EXECUTOR,
            target=refresh,
            details={
                "step": step.value,
                "workers": [{"key": w.key, "reason": reasons[w.pk]} for w in workers],
                "quarantines": [q.pk for q in opened],
                "budget": describe(refresh),
            },
            correlation_id=refresh.correlation_id,
        )
        for q in opened:
            record(
                AuditAction.QUARANTINE_STARTED,
                actor=EXECUTOR,
                target=q,
                details={"key": q.key, "kind": q.kind, "detail": q.detail},
                correlation_id=q.correlation_id,
            )


def open_quarantines(
    refresh: PolicyRefresh,
    workers: list[PlannedWorker],
    reasons: dict[int, str],
    paused: dict[int, bool],
) -> list[Quarantine]:
    """A `failed` quarantine per worker (its target: this refresh's policy), unless one is
    open for it already (that one keeps owning the worker)."""
    lockorder.domain_lock("quarantines")
    owned = set(
        Quarantine.objects.filter(
            source=refresh.source,
            state__in=OPEN_QUARANTINE_STATES,
            instance_id__in=[w.instance_id for w in workers],
        ).values_list("namespace", "instance_id")
    )
    opened = []
    for w in workers:
        if (w.namespace, w.instance_id) in owned:
            continue
        still_paused = paused.get(w.pk, True)
        reason = reasons[w.pk]
        if not still_paused:
            reason += "; it could not be paused again and may be serving outside the verified set"
        try:
            with transaction.atomic():
                opened.append(
                    Quarantine.objects.create(
                        source=refresh.source,
                        namespace=w.namespace,
                        instance_id=w.instance_id,
                        key=w.key,
                        worker_id=w.worker_id,
                        kind=KIND,
                        detail=reason,
                        state=QuarantineState.FAILED,
                        reason=reason,
                        paused=still_paused,
                        target=refresh.target,
                    )
                )
        except IntegrityError:
            continue  # opened meanwhile by someone else: it owns the worker
    return opened


def drift_entries(refresh: PolicyRefresh) -> dict[str, list[dict]]:
    """Per namespace, the gate drift entries of this refresh's left-out workers."""
    out_ids = left_out_ids(refresh.pk)
    if not out_ids:
        return {}
    reasons = dict(
        WorkerStepResult.objects.filter(refresh=refresh, status=LEFT_OUT).values_list(
            "planned_worker_id", "error"
        )
    )
    quarantines = {
        (q.namespace, q.instance_id): q
        for q in Quarantine.objects.filter(
            source=refresh.source, state__in=OPEN_QUARANTINE_STATES, kind=KIND
        )
    }
    entries: dict[str, list[dict]] = {}
    for w in refresh.workers.filter(pk__in=out_ids):
        q = quarantines.get((w.namespace, w.instance_id))
        entry: dict[str, Any] = {
            "key": w.key,
            "instance_id": w.instance_id,
            "kind": KIND,
            "detail": reasons.get(w.pk, ""),
            "state": q.state if q else QuarantineState.FAILED.value,
        }
        if q is not None:
            entry["quarantine_id"] = q.pk
        entries.setdefault(w.namespace, []).append(entry)
    return entries
