"""The failure budget (`Strategy.max_failed`): workers that may fail without holding the scope.

When a worker step fails on some workers and the refresh's budget still covers them, those
workers are left out instead of holding the refresh: each gets a `left_out` result at the step
(no later step calls it), is paused again where it was already serving (a failed verify runs
after the resume), and is handed to the quarantine machinery as a `failed` quarantine naming
the step and error — paused, out of the verified set, with `retry` (catch up to the refresh's
policy once the gate stands for it), `release` and `drop` as its exits. The gate lists them in
`instance_sets.left_out` while the refresh runs and as `left_out` drift entries once it opens,
so trainers always see how many are left out and why. The step then runs again for the rest.

Membership changes found by the `resolve` and `reopen` checks draw on the same budget
(`absorb_membership`): a worker that left is recorded as departed; one listed changed (an
error, a moved admin route, another family's routes) is left out and quarantined like a failed
step; one that joined (a new instance id: a new or restarted worker) is kept out of the
verified set — it is not the refresh's to update — and named on the gate with its reason until
drift reconciliation takes it over per the source's drift policy. Departures recorded on a
retry, and joiners a person left out (`resolve membership`), count too.

A canary wave never draws on the budget: a canary is judged whole. Over budget, the refresh
holds as it always did. Without a budget (`max_failed` 0) nothing here acts.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import record
from controlplane.dynamo.families import UpdateMethod
from controlplane.refresh import gates
from controlplane.refresh.departed import LEFT_OUT, departed_ids, left_out_ids
from controlplane.refresh.executor.calls import WorkerJob
from controlplane.refresh.executor.departures import EXECUTOR, LEFT_THE_FLEET, write_departures
from controlplane.refresh.executor.journal import run_step_calls
from controlplane.refresh.executor.waves import by_namespace, is_canary_wave
from controlplane.refresh.membership import MembershipChange, changed_details
from controlplane.refresh.models import (
    OPEN_QUARANTINE_STATES,
    PlannedWorker,
    PolicyRefresh,
    Quarantine,
    QuarantineState,
    WorkerStepResult,
)
from controlplane.refresh.step_order import StepName
from controlplane.refresh.strategy import stored
from controlplane.textlimits import REASON_CHARS

#: The quarantine kind (and gate drift kind) of a worker left out by a refresh's budget.
KIND = gates.LEFT_OUT_KIND
#: Steps after which the failed worker may be serving again and is paused once more.
SERVING_AFTER = (StepName.RESUME_ENGINES, StepName.VERIFY)
#: The drift entry state of a joiner the budget kept out, until drift reconciliation acts.
JOINED_STATE = "not_verified"


def allowed(refresh: PolicyRefresh) -> int:
    """How many workers the budget covers (a percentage of the planned workers)."""
    return stored(refresh).max_failed.of(refresh.workers.count())


def joiner_keys(refresh: PolicyRefresh) -> list[str]:
    """Listed workers kept out of the verified set that the plan never had (joiners)."""
    planned = set(refresh.plan_membership or [])
    return sorted(k for k in refresh.left_out or [] if k not in planned)


def used(refresh: PolicyRefresh) -> int:
    return len(left_out_ids(refresh.pk) | departed_ids(refresh.pk)) + len(joiner_keys(refresh))


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


def absorb_membership(ctx, step: StepName, change: MembershipChange) -> tuple[bool, str]:
    """Let the budget cover a membership change found by `resolve` or `reopen`.

    Returns (absorbed, note) like `absorb`: absorbed means the step goes on without the
    workers named in `change` (leavers recorded departed, changed ones left out and
    quarantined, joiners kept out of the verified set); otherwise the note says why the
    refresh holds on the change as it always did.
    """
    refresh: PolicyRefresh = ctx.refresh
    budget = allowed(refresh)
    if budget == 0 or refresh.target.get("method") == UpdateMethod.DISTRIBUTED:
        return False, ""
    planned = {w.key: w for w in refresh.workers.all()}
    leavers = [planned[k] for k in change.get("left", []) if k in planned]
    changed = {planned[key].pk: detail for key, detail in changed_details(change).items()}
    changed_workers = [w for w in planned.values() if w.pk in changed]
    joined = sorted(k for k in change.get("joined", []) if k not in planned)
    if is_canary_wave(refresh) and any(w.wave == 1 for w in [*leavers, *changed_workers]):
        return False, "a canary is judged whole: the failure budget does not cover it"
    cost = len(leavers) + len(changed_workers) + len(joined)
    spent = used(refresh)
    if spent + cost > budget:
        return False, (
            f"over the failure budget: {cost} left, joined or changed now, {spent} already "
            f"out, {budget} allowed"
        )
    left_out = sorted({*(refresh.left_out or []), *joined})
    gone_or_new = by_namespace(leavers)
    for key in joined:
        namespace, instance_id = key.split("/", 1)[0], key.rsplit("/", 1)[1]
        gone_or_new.setdefault(namespace, []).append(instance_id)
    with transaction.atomic():
        ctx.lease.guard(left_out=left_out, membership_change={})
        refresh.left_out = left_out
        refresh.membership_change = {}
        # Lock order: gates before the audit chain head (taken by the records below).
        if gone_or_new:
            gates.wave_left_out(
                refresh,
                gone_or_new,
                reason=f"policy refresh #{refresh.pk}: {cost} worker(s) that left, joined or "
                f"changed are out of the verified set ({describe(refresh)})",
            )
        if leavers:
            write_departures(
                refresh,
                leavers,
                step=step,
                attempt=ctx.attempt,
                reason=LEFT_THE_FLEET.format(source=refresh.source.name),
                actor=EXECUTOR,
                outcome="left the fleet; counted against the failure budget",
            )
        if joined:
            record(
                AuditAction.POLICY_REFRESH_WORKERS_LEFT_OUT,
                actor=EXECUTOR,
                target=refresh,
                details={
                    "step": step.value,
                    "joined": joined,
                    "reason": joined_reason(refresh),
                    "budget": describe(refresh),
                },
                correlation_id=refresh.correlation_id,
            )
    if changed_workers:
        # A worker found changed at reopen was resumed and verified earlier: pause it again.
        if step == StepName.REOPEN:
            paused = repause(ctx, changed_workers)
        else:
            paused = {w.pk: False for w in changed_workers}
        reasons = {
            pk: f"changed during policy refresh #{refresh.pk} (found at {step.value}): {detail}"
            for pk, detail in changed.items()
        }
        leave_out(ctx, step, changed_workers, {}, paused, reasons=reasons)
    return True, (
        f"{len(leavers)} left, {len(joined)} joined, {len(changed_workers)} changed: out of the "
        f"verified set by the failure budget ({describe(refresh)})"
    )


def joined_reason(refresh: PolicyRefresh) -> str:
    return (
        f"joined during policy refresh #{refresh.pk}: not updated or verified by it, kept out "
        "of the verified set; drift reconciliation takes it over per the source's drift policy"
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
    *,
    reasons: dict[int, str] | None = None,
) -> None:
    refresh: PolicyRefresh = ctx.refresh
    now = timezone.now()
    reasons = reasons or {
        w.pk: f"failed {step.value} in policy refresh #{refresh.pk}: {errors.get(w.pk, '')}"
        for w in workers
    }
    reasons = {pk: reason[:REASON_CHARS] for pk, reason in reasons.items()}
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


def drift_entries(refresh: PolicyRefresh) -> dict[str, list[gates.DriftEntry]]:
    """Per namespace, the gate drift entries of this refresh's left-out workers."""
    out_ids = left_out_ids(refresh.pk)
    entries: dict[str, list[gates.DriftEntry]] = {}
    if allowed(refresh):
        # Joiners the budget covered (or a person left out) are named too: never silently.
        for key in joiner_keys(refresh):
            namespace = key.split("/", 1)[0]
            entries.setdefault(namespace, []).append(
                {
                    "key": key,
                    "instance_id": key.rsplit("/", 1)[1],
                    "kind": KIND,
                    "detail": joined_reason(refresh),
                    "state": JOINED_STATE,
                }
            )
    if not out_ids:
        return entries
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
    for w in refresh.workers.filter(pk__in=out_ids):
        q = quarantines.get((w.namespace, w.instance_id))
        entry: gates.DriftEntry = {
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
