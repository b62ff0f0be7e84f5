"""Celery adapters: take ids, call the executor or the reconciler. No logic lives here."""

import functools

from celery import shared_task
from django.conf import settings

from controlplane import jobs
from controlplane.refresh import drift, freshness, quarantine, stale_policy
from controlplane.refresh.apps import ENFORCE_LAG_TASK, RECONCILE_DRIFT_TASK
from controlplane.refresh.drills import runner, schedule
from controlplane.refresh.drills.runner import RUN_DRILL_TASK
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.executor.tracing import quarantine_trace
from controlplane.refresh.intents import analysis, canary, expiry, external, watch
from controlplane.refresh.intents.base import EXECUTE_TASK
from controlplane.refresh.quarantine import CATCH_UP_TASK
from controlplane.refresh.reconcile import reconcile_policy_refreshes as reconcile
from controlplane.refresh.reconcile import requeue_stalled_quarantines


@shared_task(name=EXECUTE_TASK, ignore_result=True)
def execute_policy_refresh(refresh_id: int) -> str:
    # No Celery retry: a lost executor is recovered by the reconciler from the journal.
    return execute_refresh(refresh_id)


@shared_task(name="refresh.reconcile_policy_refreshes", ignore_result=True)
def reconcile_policy_refreshes() -> list[int]:
    # Sends that fail (the broker went away again) are logged; the next tick finds the same
    # rows, so one refused send never stops the others.
    resumed = reconcile(resume=functools.partial(jobs.send, EXECUTE_TASK))
    requeue_stalled_quarantines(resume=functools.partial(jobs.send, CATCH_UP_TASK))
    return resumed


@shared_task(name=RECONCILE_DRIFT_TASK, ignore_result=True)
def reconcile_drift(source_id: int, run_id: int | None = None) -> list[int]:
    opened = drift.reconcile_source(source_id, run_id)
    for quarantine_id in opened:
        # Refused: the quarantine stays queued, and the reconciler requeues it once stalled.
        jobs.send(CATCH_UP_TASK, quarantine_id)
    return opened


@shared_task(name=CATCH_UP_TASK, ignore_result=True)
def catch_up_quarantine(quarantine_id: int) -> str:
    with quarantine_trace(quarantine_id):  # its calls carry the target version
        return quarantine.catch_up(quarantine_id)


@shared_task(name=ENFORCE_LAG_TASK, ignore_result=True)
def enforce_policy_lag(source_id: int | None = None) -> dict[int, list[str]]:
    """One source after a publication; every source with a max-lag action on the beat."""
    ids = [source_id] if source_id is not None else stale_policy.sources_to_enforce()
    return {pk: stale_policy.enforce(pk) for pk in ids}


@shared_task(name="refresh.sync_gate_freshness", ignore_result=True)
def sync_gate_freshness() -> dict[str, int]:
    return freshness.sync_all()


@shared_task(name="refresh.expire_stale_plans", ignore_result=True)
def expire_stale_plans() -> list[int]:
    return expiry.expire_stale_plans()


@shared_task(name="refresh.expire_canary_reviews", ignore_result=True)
def expire_canary_reviews() -> list[int]:
    # The same tick sends again a canary analysis whose task was lost (analysis.py).
    analysis.requeue_stalled_analyses()
    return canary.expire_canary_reviews()


@shared_task(name="refresh.watch_reopened", ignore_result=True)
def watch_reopened() -> dict[int, str]:
    return watch.watch_reopened()


@shared_task(name="refresh.analyse_canary", ignore_result=True)
def analyse_canary(refresh_id: int) -> str:
    return analysis.run_canary_analysis(refresh_id)


@shared_task(name="refresh.expire_apply_waits", ignore_result=True)
def expire_apply_waits() -> list[int]:
    return external.expire_apply_waits()


@shared_task(name=RUN_DRILL_TASK, ignore_result=True)
def run_drill(drill_id: int) -> bool:
    """Advance a rollback drill; while its refresh runs, poll again shortly (no worker thread
    waits on it). Returns whether the drill has ended."""
    if not runner.claim(drill_id):
        return False  # another run holds it, or it has ended
    try:
        ended = runner.advance(drill_id)
    finally:
        runner.unclaim(drill_id)
    if not ended:
        runner.enqueue_drill(drill_id, countdown=settings.DRILL_POLL_SECONDS)
    return ended


@shared_task(name="refresh.drill_tick", ignore_result=True)
def drill_tick() -> dict[str, list[int]]:
    """Beat: start due scheduled drills, and queue again drills whose task chain died."""
    resend = functools.partial(jobs.send, run_drill.name)  # refused: found stalled again later
    return {
        "started": schedule.start_due_drills(),
        "resumed": runner.resume_stalled_drills(resume=resend),
    }
