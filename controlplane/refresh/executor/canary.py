"""Rolling a failed canary back: only its workers return to the gate's old policy.

A canary fails when any of its workers fails a step (update, the fingerprint or generation
check of verify, the agreement check), when the trainer or a person rejects it, or when nobody
answers before its deadline. The refresh then moves to `canary_rollback`: each canary worker is
paused, updated to the policy the gate stood for before the refresh (`progress.previous_policy`),
flushed where its family needs it, read back at that version while still paused, and resumed.
Workers rolled back rejoin the gate's old set; the refresh then holds with the reason. A worker
that cannot be rolled back holds the refresh at this step: a retry rolls back only those.
"""

from __future__ import annotations

from django.db import transaction

from controlplane.dynamo.policy import OutboundPolicy
from controlplane.refresh import gates
from controlplane.refresh.departed import departed_ids
from controlplane.refresh.executor import waves
from controlplane.refresh.executor.calls import WorkerJob
from controlplane.refresh.executor.step_base import StepContext, StepResult
from controlplane.refresh.executor.steps import (
    WorkerStep,
    ok_worker_ids,
    summarize_failures,
)
from controlplane.refresh.models import PlannedWorker
from controlplane.refresh.planning import normalize_verification, plan_worker, source_policy
from controlplane.refresh.progress import previous_policy
from controlplane.refresh.step_order import StepName
from controlplane.refresh.targets import Target

#: Only the version readback: the old policy was verified when the gate opened for it.
ROLLBACK_VERIFICATION = {"version_readback": True, "liveness": False, "generation": False}


class CanaryRollback(WorkerStep):
    name = StepName.CANARY_ROLLBACK

    def run(self, ctx: StepContext) -> StepResult:
        refresh = ctx.refresh
        previous = previous_policy(refresh)
        if not previous:
            return StepResult(
                False,
                "the scope had no verified policy before this refresh: there is nothing to roll "
                "the canary back to; it stays as the failure left it",
            )
        done = ok_worker_ids(refresh.pk, self.name) | departed_ids(refresh.pk)
        canary = [w for w in refresh.workers.all() if w.wave == 1 and w.pk not in done]
        policy = source_policy(refresh.source) or OutboundPolicy(())
        jobs, blocked = [], []
        for w in canary:
            job, problem = self.rollback_job(refresh, w, previous, policy)
            if job is None:
                blocked.append(f"{w.key}: {problem}")
            else:
                jobs.append(job)
        journal = self.run_jobs(ctx, jobs)
        back = [
            w
            for w in canary
            if any(o.planned_worker_id == w.pk and o.status == "ok" for o in journal.outcomes)
        ]
        if back:
            with transaction.atomic():
                ctx.lease.guard()
                gates.canary_rolled_back(
                    refresh,
                    waves.by_namespace(back),
                    reason=f"policy refresh #{refresh.pk}: canary rolled back to "
                    f"{previous.get('weight_version')!r}",
                )
        failed = [o for o in journal.outcomes if o.status != "ok"]
        if failed or blocked:
            reason = summarize_failures("canary rollback", journal.outcomes, len(jobs))
            if blocked:
                reason += "; cannot be rolled back: " + "; ".join(blocked[:5])
            return StepResult(False, reason)
        return StepResult(
            True,
            detail=f"{len(back)} canary worker(s) rolled back to "
            f"{previous.get('weight_version')!r}",
        )

    def rollback_job(
        self, refresh, worker: PlannedWorker, previous: Target, policy: OutboundPolicy
    ) -> tuple[WorkerJob | None, str]:
        if worker.worker is None:
            return None, "its fleet record is gone"
        plan = plan_worker(
            worker.worker,
            target=previous,
            pause_mode=refresh.pause_mode,
            pause_modes=refresh.pause_modes,
            flush_policy=refresh.flush_policy,
            verification=normalize_verification(ROLLBACK_VERIFICATION),
            policy=policy,
        )
        if plan.blockers:
            return None, "; ".join(plan.blockers)
        calls = [
            *plan.calls.get(StepName.PAUSE, []),
            *plan.calls.get(StepName.UPDATE, []),
            *plan.calls.get(StepName.FLUSH, []),
            # Read back while still paused: it never serves before it holds the old weights.
            *plan.calls.get(StepName.VERIFY, []),
            *plan.calls.get(StepName.RESUME_ENGINES, []),
        ]
        job = WorkerJob(
            planned_worker_id=worker.pk,
            key=worker.key,
            system_url=worker.system_url,
            family=worker.family,
            calls=calls,
            expect_version=previous.get("weight_version"),
        )
        return job, ""
