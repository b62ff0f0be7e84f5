"""The step objects of a policy refresh. Each returns a typed `StepResult`.

Worker steps run only on workers without an `ok` result for that step, which is what makes a
retry touch only failed or unreached workers and a takeover resume from the journal.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.bulk import insert_values
from controlplane.dynamo.families import UpdateMethod, routes_fit
from controlplane.fleet.models import Worker, WorkerState
from controlplane.refresh import gates
from controlplane.refresh.compat_record import verification_ran
from controlplane.refresh.departed import departed_ids, departed_keys, left_out_ids
from controlplane.refresh.executor import budget, waves
from controlplane.refresh.executor.agreement import check_agreement
from controlplane.refresh.executor.calls import WorkerJob
from controlplane.refresh.executor.departures import (
    read_listing,
    rechecks_membership,
    record_departures,
)
from controlplane.refresh.executor.distributed import run_distributed_update, tear_down
from controlplane.refresh.executor.external import run_external_update
from controlplane.refresh.executor.handover import audit_taken_over, take_over_quarantines
from controlplane.refresh.executor.journal import RESULT_FIELDS, run_step_calls
from controlplane.refresh.executor.step_base import Step, StepContext, StepResult
from controlplane.refresh.membership import ChangedWorker, MembershipChange, has_change
from controlplane.refresh.models import (
    Gate,
    JournalEntry,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
    WorkerStepResult,
)
from controlplane.refresh.namespaces import (
    open_namespaces,
    out_of_play_ids,
    reopened_namespaces,
    resolved_of,
)
from controlplane.refresh.planning import GENERATION, update_is_idempotent
from controlplane.refresh.step_order import StepName

EXECUTOR = Actor.system("policy-refresh executor")
MAX_NAMED_FAILURES = 5


class CloseGate(Step):
    name = StepName.GATE

    def run(self, ctx: StepContext) -> StepResult:
        if waves.is_staged(ctx.refresh):
            with transaction.atomic():
                ctx.lease.guard()
                taken = take_over_quarantines(ctx.refresh)
                detail = waves.begin(ctx.lease, ctx.refresh, EXECUTOR)
                audit_taken_over(ctx.refresh, taken, actor=EXECUTOR)
            return StepResult(True, detail=detail)
        with transaction.atomic():
            ctx.lease.guard()
            taken = take_over_quarantines(ctx.refresh)
            gates.close_gates(
                ctx.refresh,
                actor=EXECUTOR,
                reason=f"policy refresh #{ctx.refresh.pk} to {ctx.refresh.weight_version!r}",
            )
            audit_taken_over(ctx.refresh, taken, actor=EXECUTOR)
        return StepResult(True, detail=f"closed {', '.join(ctx.refresh.namespaces)}")


def _namespace_of(key: str) -> str:
    # Identity keys are namespace/component/endpoint/instance_id.
    return key.split("/", 1)[0]


def membership_change(ctx: StepContext, step: StepName) -> tuple[MembershipChange, dict, str]:
    """Read the listener now and compare the scope with what the refresh expects.

    Returns (change, the listed workers of the namespaces in play by key, error).

    Expected are the plan's workers of the namespaces still in play, less those recorded as
    departed. Compared are identities (who left, who joined — less the workers a person chose
    to leave out), and for each expected worker still listed its admin route and its error: a
    worker listed with a probe error, a moved `system_url` or routes of another family is not
    the worker that was verified. On a retry, planned workers that left since are recorded as
    departed (a person chose to go on) instead of holding again.
    """
    refresh = ctx.refresh
    listed, error = read_listing(ctx, step)
    if error:
        return MembershipChange(), {}, error
    in_play = set(open_namespaces(refresh))
    listed = {k: w for k, w in listed.items() if w.identity.namespace in in_play}
    planned = {w.key: w for w in refresh.workers.all() if w.namespace in in_play}
    expected = {k for k in refresh.plan_membership if _namespace_of(k) in in_play}
    expected -= departed_keys(refresh.pk)
    # Left out by the failure budget: out of the verified set already, owned by a quarantine.
    out = left_out_ids(refresh.pk)
    out_keys = {w.key for w in planned.values() if w.pk in out}
    expected -= out_keys
    if rechecks_membership(ctx):
        left_planned = [planned[k] for k in sorted(expected - set(listed)) if k in planned]
        record_departures(ctx, step, left_planned, set(listed))
        expected &= set(listed)
    changed: list[ChangedWorker] = []
    for key in sorted(expected & set(listed)):
        worker, plan = listed[key], planned.get(key)
        if worker.error is not None:
            changed.append(ChangedWorker(key=key, detail=f"listed with an error: {worker.error}"))
        elif plan is not None and (worker.system_url or "") != plan.system_url:
            changed.append(
                ChangedWorker(
                    key=key,
                    detail=f"admin route moved from {plan.system_url or 'none'} "
                    f"to {worker.system_url or 'none'}",
                )
            )
        elif plan is not None and plan.family and not routes_fit(worker.routes, plan.family):
            changed.append(
                ChangedWorker(
                    key=key,
                    detail=f"advertised routes are no longer those of a {plan.family} worker",
                )
            )
    left = sorted(expected - set(listed))
    joined = sorted(set(listed) - expected - out_keys - set(refresh.left_out or []))
    touched = {_namespace_of(k) for k in left + joined} | {_namespace_of(c["key"]) for c in changed}
    change = MembershipChange(
        step=str(step), namespaces=sorted(touched), left=left, joined=joined, changed=changed
    )
    return change, listed, ""


def describe_membership_change(change: MembershipChange) -> str:
    """One line naming who left, joined or changed (the first few of each)."""

    def named(keys: list[str]) -> str:
        extra = len(keys) - MAX_NAMED_FAILURES
        more = f" (+{extra} more)" if extra > 0 else ""
        return ", ".join(keys[:MAX_NAMED_FAILURES]) + more

    parts = []
    if change.get("left"):
        parts.append(f"left: {named(change['left'])}")
    if change.get("joined"):
        parts.append(f"joined: {named(change['joined'])}")
    if change.get("changed"):
        parts.append(
            "changed: " + named([f"{c['key']} ({c['detail']})" for c in change["changed"]])
        )
    return "membership changed since the plan (" + "; ".join(parts) + ")"


def membership_problem(ctx: StepContext, step: StepName) -> tuple[str | None, dict]:
    """The membership check of `resolve` and `reopen`: (problem or None, listed workers).

    A change is stored on the refresh (`membership_change`) so the hold names who left or
    joined and the "resolve membership" action acts on exactly that; a pass clears it.
    """
    change, listed, error = membership_change(ctx, step)
    if error:
        return f"discovery failed: {error}", {}
    problem = has_change(change)
    note = ""
    if problem:
        absorbed, note = budget.absorb_membership(ctx, step, change)
        if absorbed:
            return None, listed
    with transaction.atomic():
        ctx.lease.guard(membership_change=change if problem else {})
    ctx.refresh.membership_change = change if problem else {}
    if not problem:
        return None, listed
    described = describe_membership_change(change)
    return (f"{described} ({note})" if note else described), listed


class Resolve(Step):
    name = StepName.RESOLVE

    def run(self, ctx: StepContext) -> StepResult:
        problem, _ = membership_problem(ctx, self.name)
        if problem:
            return StepResult(False, problem)
        return StepResult(True, detail=f"{len(ctx.refresh.plan_membership)} workers as planned")


def ok_worker_ids(refresh_id: int, step: str) -> set[int]:
    return set(
        WorkerStepResult.objects.filter(
            refresh_id=refresh_id, step=step, status__in=("ok", "skipped")
        ).values_list("planned_worker_id", flat=True)
    )


@dataclass(frozen=True, slots=True)
class DoneBefore:
    """Where a worker step's run stands among its runs: the wave being run (of how many) and
    the workers that finished the step (ok or skipped) before this run and are not run again,
    in this wave (a retry, a takeover) and in the earlier waves of a staged refresh."""

    wave: int = 1
    waves: int = 1
    this_wave: int = 0
    earlier_waves: int = 0

    def summary(self, ran: str) -> str:
        """`ran` ("3 workers ok, 1 skipped") placed among the step's runs, so a retry's "1
        worker ok" or a later wave's "2 workers ok" never reads as the step's whole work."""
        detail = f"wave {self.wave} of {self.waves}: {ran}" if self.waves > 1 else ran
        if self.this_wave:
            where = " in this wave" if self.waves > 1 else ""
            detail += f" this attempt; {self.this_wave} already done earlier{where}"
        if self.earlier_waves:
            detail += f"; {self.earlier_waves} done in earlier waves"
        return detail


def done_before(ctx: StepContext, step: str, pending: list[PlannedWorker]) -> DoneBefore:
    refresh = ctx.refresh
    running = {w.pk for w in pending}
    this_wave = earlier_waves = 0
    rows = (
        WorkerStepResult.objects.filter(
            refresh_id=refresh.pk, step=step, status__in=("ok", "skipped")
        )
        .values_list("planned_worker_id", "planned_worker__wave")
        .distinct()
    )
    for worker_id, wave in rows:
        if worker_id in running:
            continue
        if wave is not None and wave < refresh.wave:
            earlier_waves += 1
        else:
            this_wave += 1
    return DoneBefore(refresh.wave, refresh.waves, this_wave, earlier_waves)


def summarize_failures(step: str, outcomes, total: int) -> str:
    failed = [o for o in outcomes if o.status != "ok"]
    named = "; ".join(f"{o.key}: {o.error}" for o in failed[:MAX_NAMED_FAILURES])
    more = (
        f" (+{len(failed) - MAX_NAMED_FAILURES} more)" if len(failed) > MAX_NAMED_FAILURES else ""
    )
    return f"{step} failed on {len(failed)} of {total} workers — {named}{more}"


#: A worker's step an abort stopped: cancelled in flight, or never called.
STOPPED = frozenset({"cancelled", "unreached"})


def cancelled_summary(outcomes) -> str:
    """What an abort stopped in a step: "N calls cancelled (M had reached the worker)", and
    the workers it left uncalled. The runner puts it after "aborted by <who>: "."""
    cancelled = [r for o in outcomes for r in o.records if r.cancelled]
    reached = sum(1 for r in cancelled if r.reached)
    unreached = sum(1 for o in outcomes if o.status == "unreached")
    text = (
        f"{len(cancelled)} call{'' if len(cancelled) == 1 else 's'} cancelled "
        f"({reached} had reached the worker)"
    )
    if unreached:
        text += f", {unreached} worker{'' if unreached == 1 else 's'} not called"
    return text


class WorkerStep(Step):
    """Call every planned worker that has not yet succeeded at this step."""

    def pending(self, ctx: StepContext) -> list[PlannedWorker]:
        done = ok_worker_ids(ctx.refresh.pk, self.name) | out_of_play_ids(ctx.refresh)
        # Only the wave being run (every worker is in wave 1 of an all-at-once refresh).
        pending = [
            w for w in waves.in_wave(ctx.refresh, ctx.refresh.workers.all()) if w.pk not in done
        ]
        if pending and rechecks_membership(ctx):
            gone = record_departures(ctx, self.name, pending)
            pending = [w for w in pending if w.pk not in gone]
        return pending

    def job(self, ctx: StepContext, worker: PlannedWorker, step: str | None = None) -> WorkerJob:
        return WorkerJob(
            planned_worker_id=worker.pk,
            key=worker.key,
            system_url=worker.system_url,
            family=worker.family,
            calls=worker.calls.get(step or self.name, []),
        )

    def record_skipped(self, ctx: StepContext, workers: list[PlannedWorker]) -> None:
        if not workers:
            return
        now = timezone.now()
        with transaction.atomic():
            ctx.lease.guard()
            # Plain values through one COPY, as the journal's own results (a flush that the
            # disk update makes unnecessary skips every worker of the fleet).
            insert_values(
                WorkerStepResult,
                RESULT_FIELDS,
                [
                    (
                        ctx.refresh.pk,
                        w.pk,
                        self.name,
                        ctx.attempt,
                        "skipped",
                        w.flush_skipped or "no calls planned for this step",
                        0.0,
                        now,
                    )
                    for w in workers
                ],
            )

    def run_jobs(self, ctx: StepContext, jobs: list[WorkerJob], step: str | None = None):
        return run_step_calls(ctx.lease, step or self.name, ctx.attempt, jobs, ctx.cfg)

    def run(self, ctx: StepContext) -> StepResult:
        pending = self.pending(ctx)
        skipped = [w for w in pending if not w.calls.get(self.name)]
        self.record_skipped(ctx, skipped)
        jobs = [self.job(ctx, w) for w in pending if w.calls.get(self.name)]
        return self.judge(
            self.run_jobs(ctx, jobs),
            len(jobs),
            skipped=len(skipped),
            before=done_before(ctx, self.name, pending),
        )

    def judge(
        self, journal, total: int, *, skipped: int = 0, before: DoneBefore | None = None
    ) -> StepResult:
        if journal.aborted and any(o.status in STOPPED for o in journal.outcomes):
            return StepResult(False, cancelled_summary(journal.outcomes), aborted=True)
        if any(o.status != "ok" for o in journal.outcomes):
            # Out of the step's whole scope: a retry runs only the workers still to do, and
            # "failed on 1 of 1 workers" would hide the eleven done before it.
            done = (before.this_wave + before.earlier_waves) if before is not None else 0
            scope = total + skipped + done
            return StepResult(False, summarize_failures(self.name, journal.outcomes, scope))
        if journal.aborted:
            return StepResult(True, aborted=True)
        detail = f"{total} worker{'' if total == 1 else 's'} ok"
        if skipped:
            detail += f", {skipped} skipped"
        return StepResult(True, detail=(before or DoneBefore()).summary(detail))


class Pause(WorkerStep):
    name = StepName.PAUSE

    def pending(self, ctx: StepContext) -> list[PlannedWorker]:
        pending = super().pending(ctx)
        if pending and waves.is_staged(ctx.refresh):
            # Trainers stop sending this wave rollouts before it stops serving.
            with transaction.atomic():
                ctx.lease.guard()
                waves.stage(ctx.refresh, pending)
        return pending


class Update(WorkerStep):
    name = StepName.UPDATE

    def run(self, ctx: StepContext) -> StepResult:
        if ctx.refresh.target.get("method") == UpdateMethod.DISTRIBUTED:
            return self.run_distributed(ctx)
        if ctx.refresh.target.get("method") == UpdateMethod.EXTERNAL:
            return self.run_external(ctx)
        pending = [w for w in self.pending(ctx) if w.calls.get(self.name)]
        if ctx.takeover and pending:
            # The previous executor died during this step: for these workers we do not know
            # whether the update landed. Only an idempotent update may simply be repeated.
            unsafe = [w for w in pending if not update_is_idempotent(w.family, ctx.refresh.target)]
            if unsafe:
                names = ", ".join(w.key for w in unsafe[:MAX_NAMED_FAILURES])
                return StepResult(
                    False,
                    f"executor lost during update; outcome unknown on {len(unsafe)} workers "
                    f"whose {unsafe[0].family} {ctx.refresh.target['method']} update is not "
                    f"safe to repeat ({names})",
                )
            # Re-pause first (idempotent): the worker may have been resumed by hand.
            repause = self.run_jobs(
                ctx, [self.job(ctx, w, StepName.PAUSE) for w in pending], StepName.PAUSE
            )
            if any(o.status != "ok" for o in repause.outcomes):
                return StepResult(
                    False,
                    "re-pause before repeating the update: "
                    + summarize_failures(StepName.PAUSE, repause.outcomes, len(pending)),
                )
        jobs = [self.job(ctx, w) for w in pending]
        before = done_before(ctx, self.name, pending)
        return self.judge(self.run_jobs(ctx, jobs), len(jobs), before=before)

    def run_external(self, ctx: StepContext) -> StepResult:
        """The trainer's framework applies the weights: announce and wait for its report, then
        declare and read the version back. See `executor/external.py`."""
        pending = self.pending(ctx)
        if not pending:
            return StepResult(True, detail="every worker already applied")
        return run_external_update(self, ctx, pending)

    def run_distributed(self, ctx: StepContext) -> StepResult:
        """A collective group needs every rank: unless every worker in play already applied,
        all of them join again (a retry re-forms the whole group, the trainer broadcasts
        again). See `executor/distributed.py`."""
        pending = self.pending(ctx)
        if not pending:
            return StepResult(True, detail="every worker already applied")
        out = out_of_play_ids(ctx.refresh) | departed_ids(ctx.refresh.pk)
        workers = [w for w in ctx.refresh.workers.all() if w.pk not in out]
        if ctx.takeover:
            # The group the lost executor formed may still be up: tear it down, then hold.
            why = (
                "executor lost during a distributed update: the group's state is unknown; "
                "retry to re-form it on every rank"
            )
            note = tear_down(self, ctx, workers, why)
            return StepResult(False, f"{why} ({note})")
        return run_distributed_update(self, ctx, workers)


class Flush(WorkerStep):
    name = StepName.FLUSH


class ResumeEngines(WorkerStep):
    name = StepName.RESUME_ENGINES


class Verify(WorkerStep):
    """Each worker's own checks (version, liveness, generation, trainer fingerprint), then
    cross-worker agreement of the generated completions (see `executor/agreement.py`)."""

    name = StepName.VERIFY

    def pending(self, ctx: StepContext) -> list[PlannedWorker]:
        # The latest result counts here: the agreement check can fail a worker whose own
        # checks passed earlier in the same attempt, and a retry must verify it again.
        latest: dict[int, str] = dict(
            WorkerStepResult.objects.filter(refresh_id=ctx.refresh.pk, step=self.name)
            .order_by("id")
            .values_list("planned_worker_id", "status")
        )
        out = out_of_play_ids(ctx.refresh)
        pending = [
            w
            for w in waves.in_wave(ctx.refresh, ctx.refresh.workers.all())
            if w.pk not in out and latest.get(w.pk) not in ("ok", "skipped")
        ]
        if pending and rechecks_membership(ctx):
            gone = record_departures(ctx, self.name, pending)
            pending = [w for w in pending if w.pk not in gone]
        return pending

    def job(self, ctx: StepContext, worker: PlannedWorker, step: str | None = None) -> WorkerJob:
        job = super().job(ctx, worker, step)
        if ctx.refresh.verification.get("version_readback", True):
            job.expect_version = ctx.refresh.weight_version
        return job

    def run_jobs(self, ctx: StepContext, jobs: list[WorkerJob], step: str | None = None):
        journal = super().run_jobs(ctx, jobs, step)
        if step is None:
            replies = ctx.generation_replies = {}
            for outcome in journal.outcomes:
                for record in outcome.records:
                    if record.operation == GENERATION and record.ok:
                        replies[outcome.planned_worker_id] = (
                            outcome.key,
                            record.request_body,
                            record.response_body,
                        )
        return journal

    def run(self, ctx: StepContext) -> StepResult:
        result = self._verify(ctx)
        if not result.aborted:
            record_verification(ctx, result.ok, result.detail if result.ok else result.reason)
        return result

    def _verify(self, ctx: StepContext) -> StepResult:
        result = super().run(ctx)
        if not result.ok or result.aborted or not ctx.refresh.verification.get("generation"):
            return result
        agreement = check_agreement(
            ctx.refresh,
            ctx.lease,
            ctx.attempt,
            exclude=out_of_play_ids(ctx.refresh),
            fresh=ctx.generation_replies,
        )
        if not agreement.ok:
            return StepResult(False, agreement.summary)
        detail = f"{result.detail}; {agreement.summary}" if result.detail else agreement.summary
        return StepResult(True, detail=detail)


def record_verification(ctx: StepContext, ok: bool, detail: str) -> None:
    """The compatibility record says which verification ran and how it ended."""
    compat = dict(ctx.refresh.compat or {})
    if not compat:
        return
    compat["verification"] = {
        **compat.get("verification", {}),
        "ran": verification_ran(ctx.refresh, detail, ok),
    }
    with transaction.atomic():
        ctx.lease.guard(compat=compat)
    ctx.refresh.compat = compat


class Reopen(Step):
    """Re-read discovery, then open the gates of the namespaces still in play for exactly the
    workers verified at the refresh's version."""

    name = StepName.REOPEN

    def run(self, ctx: StepContext) -> StepResult:
        problem, listed = membership_problem(ctx, self.name)
        if problem:
            return StepResult(False, problem)
        namespaces = open_namespaces(ctx.refresh)
        serving = [(w.identity.namespace, str(w.identity.instance_id)) for w in listed.values()]
        if ctx.refresh.instances is not None:
            return finish_instances(ctx, namespaces, serving)
        verified, _ = verified_instance_sets(ctx.refresh, namespaces, serving)
        left_out = budget.drift_entries(ctx.refresh)
        with transaction.atomic():
            ctx.lease.guard()
            gates.open_gates_verified(
                ctx.refresh,
                actor=EXECUTOR,
                verified=verified,
                serving=serving_by_namespace(serving),
                namespaces=namespaces,
                left_out=left_out,
            )
        count = sum(len(ids) for ids in verified.values())
        detail = (
            f"opened {', '.join(namespaces)} at {ctx.refresh.weight_version!r} "
            f"for {count} verified workers"
        )
        out = sum(len(v) for ns, v in left_out.items() if ns in namespaces)
        if out:
            detail += f"; {out} left out by the failure budget (listed on the gate with why)"
        return StepResult(True, detail=detail)


def serving_by_namespace(serving) -> dict[str, list[str]]:
    """[(namespace, instance id)] as {namespace: [instance ids]}."""
    out: dict[str, list[str]] = {}
    for namespace, instance_id in serving:
        out.setdefault(namespace, []).append(instance_id)
    return out


def finish_instances(ctx: StepContext, namespaces: list[str], serving) -> StepResult:
    """Reopen after a refresh of named instances only: the others kept serving and stay in
    the verified set. Where the refresh's version is the gate's, the refreshed instances
    rejoin that set; otherwise the gate keeps its version and they stay outside it (drift
    reconciliation then finds them at another version and acts per the source's policy)."""
    refresh = ctx.refresh
    verified_new, _ = verified_instance_sets(refresh, namespaces, serving)
    same: list[str] = []
    other: list[str] = []
    for gate in Gate.objects.filter(source=refresh.source, namespace__in=namespaces):
        (same if gate.verified_version == refresh.weight_version else other).append(gate.namespace)
    with transaction.atomic():
        ctx.lease.guard()
        if same:
            kept = {
                g.namespace: [*g.verified_instances, *verified_new.get(g.namespace, [])]
                for g in Gate.objects.filter(source=refresh.source, namespace__in=same)
            }
            gates.open_gates_verified(
                refresh,
                actor=EXECUTOR,
                verified=kept,
                serving=serving_by_namespace(serving),
                namespaces=same,
            )
        if other:
            named = ", ".join(sorted(refresh.instances or []))
            gates.release_instances(
                refresh,
                other,
                reason=f"instances {named} were refreshed to {refresh.weight_version!r} by "
                f"policy refresh #{refresh.pk}; they are outside the verified set",
            )
    return StepResult(
        True,
        detail=f"{len(refresh.instances or [])} named instance(s) refreshed; "
        f"{len(same)} namespace(s) keep them verified, {len(other)} keep their own version",
    )


def verified_instance_sets(
    refresh: PolicyRefresh,
    namespaces: list[str] | None = None,
    serving: list[tuple[str, str]] | None = None,
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Per namespace (default: all of the refresh's): the instance ids verified at the
    refresh's version (every planned worker there that did not leave the fleet: a namespace is
    opened only after verify passed for all of them), and how many workers discovery lists as
    serving there that are not among them (joiners left out, workers outside a subset).

    `serving` is (namespace, instance id) of each worker a fresh listing just read; default:
    the live workers of the last discovery run."""
    namespaces = list(refresh.namespaces if namespaces is None else namespaces)
    gone = departed_ids(refresh.pk) | left_out_ids(refresh.pk)
    verified: dict[str, list[str]] = {ns: [] for ns in namespaces}
    # Three columns, not whole planned workers: each would decode its planned calls of every
    # step (a filtered query does not use the run's prefetched workers).
    for pk, namespace, instance_id in refresh.workers.filter(namespace__in=namespaces).values_list(
        "pk", "namespace", "instance_id"
    ):
        # A static worker whose identity is unknown (no instance id) was refreshed by its URL:
        # nothing can pin to it, so it is never in a verified set.
        if pk not in gone and instance_id:
            verified[namespace].append(instance_id)
    unverified: dict[str, int] = {}
    if serving is None:
        serving = list(
            Worker.objects.filter(
                source_id=refresh.source_id, namespace__in=namespaces, state=WorkerState.LIVE
            ).values_list("namespace", "instance_id")
        )
    for namespace, instance_id in serving:
        if namespace in verified and instance_id not in verified[namespace]:
            unverified[namespace] = unverified.get(namespace, 0) + 1
    return verified, unverified


class Release(WorkerStep):
    """Resume every engine this refresh paused (abort with resume, force-reopen).

    A release carries out a person's decision, so it always completes: workers that left the
    fleet are recorded and skipped, and a listed worker whose resume fails is recorded with its
    reason (its failed result, the step detail, the end reason and the audit event) while the
    refresh still ends and frees its scope. The runner reads those failures from the results.
    """

    name = StepName.RELEASE

    def run(self, ctx: StepContext) -> StepResult:
        touched = set(
            JournalEntry.objects.filter(refresh=ctx.refresh, step=StepName.PAUSE).values_list(
                "planned_worker_id", flat=True
            )
        )
        # Workers left out by the failure budget belong to their quarantine: stay paused.
        done = (
            ok_worker_ids(ctx.refresh.pk, self.name)
            | departed_ids(ctx.refresh.pk)
            | left_out_ids(ctx.refresh.pk)
        )
        workers = [w for w in ctx.refresh.workers.all() if w.pk in touched and w.pk not in done]
        resolved = resolved_of(ctx.refresh)
        # A namespace reopened verified serves already: its engines were resumed and verified.
        serving = reopened_namespaces(ctx.refresh)
        workers = [w for w in workers if w.namespace not in serving]
        if ctx.refresh.end_state == RefreshState.HELD:
            # A namespace closed out on its own: resume only its engines; the rest stay held.
            workers = [w for w in workers if w.namespace in resolved]
        gone = record_departures(ctx, self.name, workers)
        workers = [w for w in workers if w.pk not in gone]
        jobs = [self.job(ctx, w, StepName.RESUME_ENGINES) for w in workers]
        journal = self.run_jobs(ctx, jobs)
        resumed = sum(1 for o in journal.outcomes if o.status == "ok")
        detail = f"resumed {resumed} of {len(jobs)} workers"
        if gone:
            detail += f"; {len(gone)} had left the fleet"
        if resumed < len(jobs):
            detail += "; " + summarize_failures("resume", journal.outcomes, len(jobs))
        return StepResult(True, detail=detail)


STEPS: dict[StepName, Step] = {
    step.name: step
    for step in (
        CloseGate(),
        Resolve(),
        Pause(),
        Update(),
        Flush(),
        ResumeEngines(),
        Verify(),
        Reopen(),
        Release(),
    )
}

__all__ = ["STEPS", "StepContext", "StepResult"]
