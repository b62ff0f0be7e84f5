"""The watch after a reopen: for a window after a refresh with an analysis template succeeded,
keep comparing the admitted workers' serving health (docs/concepts/canary-analysis.md).

Every `background.interval_seconds` (checked by the beat task `refresh.watch_reopened`) one
tick sends a small rotating sample of the template's prompts (`background.sample_prompts`)
through a rotating slice of the admitted workers (at most `WORKERS_PER_TICK`), each pinned with
`nvext.backend_instance_id`, and judges each worker:

- its error share over the sample above `background.max_error_rate`, or
- its median reply time above `background.max_latency_ratio` times the reference (and at
  least `LATENCY_FLOOR_MS` above it): the baseline cohort's median measured by the canary
  analysis, before the fleet moved (the window before the refresh). Without a canary report
  the latency rule is not applied. Each worker takes one sampled prompt at a time, as in the
  canary analysis, so the load per worker matches the reference's.

A worker in breach is quarantined (`drift.quarantine_unhealthy`: out of the admitted set,
paused, caught up; its catch-up's verify decides whether it comes back) and a
`refresh.analysis_done` notification names it. When at least half of a tick's workers (and
at least two) are in breach, the breach is fleet-wide: with `on_fleet_breach: rollback` a
rollback to the policy before the refresh is planned and started (approval rules apply),
otherwise it is notified. The frontend's Prometheus counters are read each tick too
(`dynamo/frontend_metrics.py`) and kept in the report for the page's panel.

The watch's record is its `CanaryAnalysis` row (phase background): one writer, this module.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from controlplane import jobs
from controlplane.analysis.spec import TemplateSpec
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor
from controlplane.dynamo.http import make_client
from controlplane.dynamo.observation import Observation
from controlplane.dynamo.scoring import observe
from controlplane.fleet.models import Worker, WorkerState
from controlplane.notify.emit import notify
from controlplane.refresh import drift
from controlplane.refresh.executor.runner import call_settings
from controlplane.refresh.intents.base import audit_refresh
from controlplane.refresh.intents.lifecycle import start_policy_refresh
from controlplane.refresh.intents.plan import plan_policy_refresh
from controlplane.refresh.models import (
    AnalysisPhase,
    AnalysisRunState,
    CanaryAnalysis,
    Gate,
    PolicyRefresh,
    RefreshState,
)
from controlplane.refresh.planning.analysis import template_spec
from controlplane.refresh.progress import ANALYSIS_FAIL, ANALYSIS_PASS, previous_policy
from controlplane.refresh.quarantine import CATCH_UP_TASK
from controlplane.refresh.strategy import rollback_strategy, stored

logger = logging.getLogger(__name__)

WATCH = Actor.system("watch after reopen")
#: The most workers one tick samples; the slice rotates, so a large fleet is covered in turn.
WORKERS_PER_TICK = 32
#: Ticks kept in the report (the page's panel); older ones are summarised by their counts.
TICKS_KEPT = 60
#: A slowdown counts only when it is also this large in absolute terms: replies of a few
#: milliseconds jitter by more than any ratio on their own (a new connection, a busy core).
LATENCY_FLOOR_MS = 250.0
#: The longest window any template may ask for bounds which refreshes are looked at.
LONGEST_WINDOW = timedelta(days=1)


@dataclass(frozen=True)
class Breach:
    worker: Worker
    why: str


def watch_reopened(now=None) -> dict[int, str]:
    """One beat tick: each watched refresh whose interval came, what it did."""
    now = now or timezone.now()
    done: dict[int, str] = {}
    for refresh in (
        PolicyRefresh.objects.filter(
            state=RefreshState.SUCCEEDED, finished_at__gte=now - LONGEST_WINDOW
        )
        .select_related("source")
        .order_by("id")
    ):
        strategy = stored(refresh)
        if strategy.canary is None or not strategy.canary.analysis:
            continue
        template, spec, _problem = template_spec(refresh.source, strategy.canary.analysis)
        if template is None or spec is None:
            continue
        run = _watch_run(refresh, template)
        if run.state != AnalysisRunState.RUNNING:
            continue
        assert refresh.finished_at is not None
        if now >= refresh.finished_at + timedelta(seconds=spec.background.window_seconds):
            done[refresh.pk] = _close(run, now)
            continue
        last = (run.report or {}).get("last_tick_at")
        due = last is None or now >= _parse(last) + timedelta(
            seconds=spec.background.interval_seconds
        )
        if due:
            done[refresh.pk] = tick(refresh, run, spec, now)
    return done


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _watch_run(refresh: PolicyRefresh, template) -> CanaryAnalysis:
    run = CanaryAnalysis.objects.filter(refresh=refresh, phase=AnalysisPhase.BACKGROUND).first()
    if run is None:
        run, _ = CanaryAnalysis.objects.get_or_create(
            refresh=refresh,
            phase=AnalysisPhase.BACKGROUND,
            defaults={"template": template, "report": {"ticks": [], "breaches": []}},
        )
    return run


def _close(run: CanaryAnalysis, now) -> str:
    breaches = (run.report or {}).get("breaches") or []
    run.state = AnalysisRunState.DONE
    run.outcome = ANALYSIS_FAIL if breaches else ANALYSIS_PASS
    run.summary = (
        f"{len(breaches)} worker(s) quarantined during the window"
        if breaches
        else "no breach during the window"
    )
    run.finished_at = now
    run.save(update_fields=["state", "outcome", "summary", "finished_at"])
    return "window closed: " + run.summary


def reference_ms(refresh: PolicyRefresh) -> float | None:
    """The baseline cohort's median reply time from the canary analysis (before the move)."""
    canary = (
        CanaryAnalysis.objects.filter(refresh=refresh, phase=AnalysisPhase.CANARY)
        .order_by("-id")
        .first()
    )
    if canary is None:
        return None
    values = ((canary.report or {}).get("values") or {}).get("baseline") or {}
    totals = [v for v in values.get("total_ms") or [] if isinstance(v, int | float)]
    return statistics.median(totals) if totals else None


def admitted_workers(refresh: PolicyRefresh) -> list[Worker]:
    """The live workers the scope's gates admit now at the refresh's version (the gate is the
    truth of what serves rollouts; a worker's last probe may lag it)."""
    target = str(refresh.weight_version)
    admitted = {
        (g.namespace, str(e["instance_id"]))
        for g in Gate.objects.filter(source=refresh.source, namespace__in=refresh.namespaces)
        for e in g.admitted or []
        if str(e.get("version")) == target
    }
    return [
        w
        for w in Worker.objects.filter(
            source=refresh.source, namespace__in=refresh.namespaces, state=WorkerState.LIVE
        ).order_by("namespace", "instance_id")
        if (w.namespace, w.instance_id) in admitted
    ]


def tick(refresh: PolicyRefresh, run: CanaryAnalysis, spec: TemplateSpec, now) -> str:
    """Sample, judge each worker, act on breaches, record the tick."""
    report = dict(run.report or {})
    number = int(report.get("tick_count") or 0)
    workers = admitted_workers(refresh)
    if not workers or not spec.prompts:
        return "no admitted workers"
    per = min(WORKERS_PER_TICK, len(workers))
    start = (number * per) % len(workers)
    chosen = [workers[(start + i) % len(workers)] for i in range(per)]
    k = min(spec.background.sample_prompts, len(spec.prompts))
    prompts = [(number * k + j) % len(spec.prompts) for j in range(k)]
    cfg = call_settings(refresh.source)
    seen = asyncio.run(_sample(spec, chosen, prompts, cfg.frontend_url, cfg.policy, cfg.timeout))
    reference = reference_ms(refresh)
    breaches = [
        b
        for w in chosen
        if (b := judge_worker(w, seen.get(w.instance_id, []), spec, reference)) is not None
    ]
    fleet_wide = len(breaches) >= 2 and len(breaches) * 2 >= len(chosen)
    entry = {
        "at": now.isoformat(),
        "workers": len(chosen),
        "prompts": prompts,
        "breaches": [{"key": b.worker.key, "why": b.why} for b in breaches],
        "fleet_wide": fleet_wide,
    }
    report["ticks"] = [*(report.get("ticks") or []), entry][-TICKS_KEPT:]
    report["tick_count"] = number + 1
    report["last_tick_at"] = now.isoformat()
    report["breaches"] = [*(report.get("breaches") or []), *entry["breaches"]]
    run.report = report
    run.save(update_fields=["report"])
    if not breaches:
        return f"{len(chosen)} worker(s) healthy"
    return _act(refresh, spec, breaches, fleet_wide)


async def _sample(spec, workers, prompts, frontend_url, policy, timeout):
    bound = asyncio.Semaphore(16)
    per_worker: dict[str, asyncio.Semaphore] = {}
    async with make_client(timeout=timeout) as client:

        async def one(w: Worker, i: int) -> tuple[str, Observation]:
            alone = per_worker.setdefault(w.instance_id, asyncio.Semaphore(1))
            async with alone, bound:
                return w.instance_id, await observe(
                    client,
                    frontend_url,
                    model=w.model,
                    instance_id=w.instance_id,
                    prompt_index=i,
                    prompt_ids=spec.prompts[i].prompt,
                    continuation_ids=None,
                    max_tokens=spec.max_tokens,
                    policy=policy,
                    timeout=timeout,
                )

        pairs = await asyncio.gather(*(one(w, i) for w in workers for i in prompts))
    out: dict[str, list[Observation]] = {}
    for iid, o in pairs:
        out.setdefault(iid, []).append(o)
    return out


def judge_worker(
    worker: Worker, seen: list[Observation], spec: TemplateSpec, reference: float | None
) -> Breach | None:
    """A worker's breach over its sample, or None."""
    if not seen:
        return None
    errors = sum(1 for o in seen if o.error)
    share = errors / len(seen)
    limits = spec.background
    if share > limits.max_error_rate:
        first = next(o.error for o in seen if o.error)
        return Breach(worker, f"{errors} of {len(seen)} sampled prompts failed ({first})")
    totals = [o.total_ms for o in seen if o.total_ms is not None]
    if reference and totals:
        median = statistics.median(totals)
        slower = median - reference
        if median > limits.max_latency_ratio * reference and slower >= LATENCY_FLOOR_MS:
            return Breach(
                worker,
                f"median reply {median:.0f} ms is over {limits.max_latency_ratio:g}x the "
                f"baseline's {reference:.0f} ms",
            )
    return None


def _act(refresh: PolicyRefresh, spec: TemplateSpec, breaches: list[Breach], fleet_wide) -> str:
    named = ", ".join(f"{b.worker.key} ({b.why})" for b in breaches[:5])
    audit_refresh(
        AuditAction.POLICY_REFRESH_ANALYSIS_BREACH,
        refresh,
        WATCH,
        workers=[b.worker.key for b in breaches],
        fleet_wide=fleet_wide,
    )
    if fleet_wide and spec.background.on_fleet_breach == "rollback":
        return _roll_back(refresh, named)
    by_namespace: dict[str, list[tuple[Worker, str]]] = {}
    for b in breaches:
        by_namespace.setdefault(b.worker.namespace, []).append((b.worker, b.why))
    opened: list[int] = []
    for namespace, found in sorted(by_namespace.items()):
        opened += drift.quarantine_unhealthy(refresh.source, namespace, found, actor=WATCH)
    for pk in opened:
        jobs.send(CATCH_UP_TASK, pk)
    what = f"after reopen: {len(opened)} worker(s) quarantined: {named}"
    if fleet_wide:
        what = f"fleet-wide breach after reopen ({named}); the source's policy notifies only"
    notify("refresh.analysis_done", refresh=refresh, reason=what)
    return what


def _roll_back(refresh: PolicyRefresh, named: str) -> str:
    """A fleet-wide breach where the template says so: plan and start a rollback to the policy
    before this refresh (an approval rule of the source still applies)."""
    previous = previous_policy(refresh)
    if not previous:
        what = f"fleet-wide breach after reopen ({named}); no earlier policy to roll back to"
        notify("refresh.analysis_done", refresh=refresh, reason=what)
        return what
    new = plan_policy_refresh(
        source=refresh.source,
        actor=WATCH,
        target=dict(previous),
        namespaces=refresh.namespaces,
        pause_mode=refresh.pause_mode,
        pause_modes=refresh.pause_modes,
        inflight_may_straddle=refresh.inflight_may_straddle,
        verification=refresh.verification,
        flush_policy=refresh.flush_policy,
        strategy=rollback_strategy(stored(refresh)),
    )
    if new.plan_blockers:
        what = (
            f"fleet-wide breach after reopen ({named}); the rollback plan #{new.pk} has "
            f"blockers: {'; '.join(new.plan_blockers)[:300]}"
        )
    else:
        with transaction.atomic():
            start_policy_refresh(new, actor=WATCH)
        what = (
            f"fleet-wide breach after reopen ({named}); rolling back with policy refresh #{new.pk}"
        )
    notify("refresh.analysis_done", refresh=refresh, reason=what)
    return what
