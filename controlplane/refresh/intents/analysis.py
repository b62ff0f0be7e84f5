"""Running a canary's analysis and acting on its outcome (docs/concepts/canary-analysis.md).

After the canary wave verified, a refresh whose strategy names an analysis template waits in
`canary_review` with its canary `analysing` (`executor/waves.next_move`), and the task
`refresh.analyse_canary` runs `run_canary_analysis`:

1. the cohorts: the canary is the wave's verified workers (on the new policy); the baseline is
   the scope's workers of later waves that are live and still serve another version;
2. the template's prompts go through the source's frontend, pinned per worker with
   `nvext.backend_instance_id` at temperature 0 (`dynamo/scoring.py`): prompt i to baseline
   worker i mod n and canary worker i mod m. Where a prompt has no reference continuation, the
   baseline's own greedy reply is the reference and both cohorts are teacher-forced on it;
3. per-prompt values (`analysis/metrics.py`) are judged (`analysis/judge.py`) into pass,
   marginal, inconclusive or fail, and the report is stored once (`CanaryAnalysis`).

The outcome maps to the strategy's exits:
- pass: on to the strategy's `evaluation` (none: the canary passes and the refresh goes on;
  manual or trainer: that verdict is asked for, as without an analysis);
- marginal or inconclusive: a person decides (`needs_person`; approve or reject, with the
  report on the page); a trainer's verdict is refused meanwhile;
- fail: the canary is rolled back (`executor/canary.py`), then the refresh holds.

The canary's deadline covers the analysis: a lost or stuck analysis fails the canary when it
passes (`expire_canary_reviews`), and an analysis that ends after an abort or a verdict changes
nothing but its own report. `requeue_stalled_analyses` sends again an analysis whose task was
lost before it began.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane import jobs
from controlplane.analysis.judge import judge
from controlplane.analysis.metrics import moved_most, per_prompt_values
from controlplane.analysis.spec import TemplateSpec
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor
from controlplane.dynamo.http import make_client
from controlplane.dynamo.observation import Observation
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.dynamo.scoring import observe
from controlplane.fleet.models import WorkerState
from controlplane.notify.emit import notify
from controlplane.refresh.canary_review import summary_of
from controlplane.refresh.departed import departed_ids, left_out_ids
from controlplane.refresh.executor.runner import call_settings
from controlplane.refresh.executor.waves import ANALYSE_CANARY_TASK, verified_in_wave
from controlplane.refresh.intents import base
from controlplane.refresh.intents.base import audit_refresh, locked_refresh
from controlplane.refresh.intents.canary import decide_locked
from controlplane.refresh.live import publish_state_on_commit
from controlplane.refresh.models import (
    AnalysisPhase,
    AnalysisRunState,
    CanaryAnalysis,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
)
from controlplane.refresh.planning.analysis import template_spec
from controlplane.refresh.progress import (
    ANALYSIS_FAIL,
    ANALYSIS_INCONCLUSIVE,
    ANALYSIS_PASS,
    CANARY_ANALYSING,
    CANARY_AWAITING,
    CanaryAnalysisRef,
    CanaryAnalysisSummary,
    analysis_ref,
    canary_of,
    with_canary_analysis,
)
from controlplane.refresh.strategy import EVAL_NONE, stored
from controlplane.textlimits import SUMMARY_CHARS

logger = logging.getLogger(__name__)

ANALYST = Actor.system("canary analysis")
#: How many prompts are in flight at once per analysis (both cohorts together).
CONCURRENCY = 16
#: The most prompts of the report's "moved most" list.
MOVED_MOST = 10
#: An analysis still `analysing` with no run row this long after the canary verified: its task
#: was lost (the broker dropped it); `requeue_stalled_analyses` sends it again.
STALL_AFTER = timedelta(minutes=2)


@dataclass(frozen=True)
class Member:
    """One cohort worker: the instance a prompt is pinned to and the model it serves."""

    key: str
    instance_id: str
    model: str


@dataclass(frozen=True)
class Cohorts:
    baseline: tuple[Member, ...]
    canary: tuple[Member, ...]


def canary_cohorts(refresh: PolicyRefresh) -> Cohorts:
    """The canary (the wave's verified workers) and the baseline (later waves' workers, live,
    not departed or left out, still on another version than the target)."""
    canary = [w for w in verified_in_wave(refresh) if w.worker_id is not None]
    gone = departed_ids(refresh.pk) | left_out_ids(refresh.pk)
    later = [
        w
        for w in PlannedWorker.objects.filter(refresh=refresh)
        .exclude(wave=refresh.wave)
        .select_related("worker")
        # What a cohort member and the baseline's test read: not the planned calls or the
        # worker's routes, decoded for every one of thousands of rows otherwise.
        .only("key", "instance_id", "model", "worker__state", "worker__weight_version")
        .order_by("id")
        if w.pk not in gone
    ]
    target = str(refresh.weight_version)
    baseline = [
        w
        for w in later
        if w.worker is not None
        and w.worker.state == WorkerState.LIVE
        and str(w.worker.weight_version) != target
    ]
    return Cohorts(
        baseline=tuple(Member(w.key, w.instance_id, w.model) for w in baseline),
        canary=tuple(Member(w.key, w.instance_id, w.model) for w in canary),
    )


# -- the task ------------------------------------------------------------------------------------


def run_canary_analysis(refresh_id: int) -> str:
    """The task body: start the run, collect both cohorts, judge, act. Returns what it did."""
    refresh = PolicyRefresh.objects.select_related("source").get(pk=refresh_id)
    strategy = stored(refresh)
    if not _analysing(refresh) or strategy.canary is None or not strategy.canary.analysis:
        return "nothing to analyse"
    template, spec, problem = template_spec(refresh.source, strategy.canary.analysis)
    begun = _begin(refresh, template) if template is not None else None
    if begun is False:
        return "already running or concluded"
    run = begun if isinstance(begun, CanaryAnalysis) else None
    cohorts = canary_cohorts(refresh)
    if spec is None or not cohorts.baseline or not cohorts.canary:
        why = problem or (
            "no baseline workers are left on the old policy"
            if not cohorts.baseline
            else "no canary worker is verified"
        )
        return _conclude(refresh, run, _cannot_judge(why, cohorts))
    try:
        report = analyse(refresh, spec, cohorts)
    except Exception as exc:  # a bug or an outage must not leave the canary analysing
        logger.exception("canary analysis of refresh #%s failed", refresh.pk)
        report = _cannot_judge(f"the analysis failed: {type(exc).__name__}: {exc}", cohorts)
    return _conclude(refresh, run, report)


def _analysing(refresh: PolicyRefresh) -> bool:
    canary = canary_of(refresh) or {}
    return refresh.state == RefreshState.CANARY_REVIEW and canary.get("state") == CANARY_ANALYSING


def _begin(refresh: PolicyRefresh, template) -> CanaryAnalysis | bool:
    """Create the run row (once): False when another task got there first."""
    with transaction.atomic():
        locked = locked_refresh(refresh)
        if not _analysing(locked):
            return False
        earlier = analysis_ref(locked).get("run_id")
        if earlier:
            run = CanaryAnalysis.objects.filter(pk=earlier).first()
            if run is not None and run.state == AnalysisRunState.RUNNING:
                return False
        run = CanaryAnalysis.objects.create(
            refresh=locked, phase=AnalysisPhase.CANARY, template=template
        )
        ref = CanaryAnalysisRef(run_id=run.pk, template=template.name)
        locked.progress = with_canary_analysis(locked, ref, state=CANARY_ANALYSING)
        locked.save(update_fields=["progress"])
        audit_refresh(
            AuditAction.POLICY_REFRESH_ANALYSIS_STARTED,
            locked,
            ANALYST,
            template=template.name,
            template_version=template.version,
        )
        publish_state_on_commit(locked)
    return run


# -- collecting and judging ----------------------------------------------------------------------


def analyse(refresh: PolicyRefresh, spec: TemplateSpec, cohorts: Cohorts) -> dict[str, Any]:
    """Send the template's prompts through both cohorts and judge them: the report."""
    cfg = call_settings(refresh.source)
    baseline, canary = asyncio.run(
        collect(spec, cohorts, cfg.frontend_url, cfg.policy, timeout=cfg.timeout)
    )
    base_values, canary_values = per_prompt_values(baseline, canary, max_tokens=spec.max_tokens)
    verdict = judge(spec.judge, base_values, canary_values)
    return {
        "judge": verdict,
        "cohorts": {
            "baseline": [m.key for m in cohorts.baseline],
            "canary": [m.key for m in cohorts.canary],
        },
        "values": {"baseline": base_values, "canary": canary_values},
        "moved_most": [
            {**m, "prompt_ids": list(spec.prompts[m["prompt_index"]].prompt)}
            for m in moved_most(baseline, canary, MOVED_MOST)
        ],
        "prompts": len(spec.prompts),
    }


async def collect(
    spec: TemplateSpec,
    cohorts: Cohorts,
    frontend_url: str,
    policy: OutboundPolicy,
    *,
    timeout: float,
) -> tuple[list[Observation], list[Observation]]:
    """Both cohorts' observations, one per prompt, in prompt order."""
    bound = asyncio.Semaphore(CONCURRENCY)
    # One prompt at a time per worker, in both cohorts: a two-worker canary and a ten-worker
    # baseline then see the same load per worker, so their latencies compare like for like.
    per_worker: dict[str, asyncio.Semaphore] = {}
    async with make_client(timeout=timeout) as client:

        async def one(member: Member, index: int, continuation) -> Observation:
            alone = per_worker.setdefault(member.instance_id, asyncio.Semaphore(1))
            async with alone, bound:
                return await observe(
                    client,
                    frontend_url,
                    model=member.model,
                    instance_id=member.instance_id,
                    prompt_index=index,
                    prompt_ids=spec.prompts[index].prompt,
                    continuation_ids=continuation,
                    max_tokens=spec.max_tokens,
                    policy=policy,
                    timeout=timeout,
                )

        def base_of(i: int) -> Member:
            return cohorts.baseline[i % len(cohorts.baseline)]

        def canary_of_(i: int) -> Member:
            return cohorts.canary[i % len(cohorts.canary)]

        indexes = range(len(spec.prompts))
        # Prompts without a reference continuation: the baseline's greedy reply is the
        # reference, so the baseline generates first.
        first = await asyncio.gather(
            *(one(base_of(i), i, None) for i in indexes if spec.prompts[i].continuation is None)
        )
        greedy = {o.prompt_index: o for o in first}
        references = {
            i: spec.prompts[i].continuation
            or (greedy[i].completion_ids if not greedy[i].error else None)
            for i in indexes
        }
        # Both cohorts at once, so the fleet's conditions of the moment are the same for both.
        both = await asyncio.gather(
            *(
                one(base_of(i), i, references[i])
                if references[i] or i not in greedy
                else _as_is(greedy[i])
                for i in indexes
            ),
            *(one(canary_of_(i), i, references[i]) for i in indexes),
        )
    n = len(indexes)
    return list(both[:n]), list(both[n:])


async def _as_is(observation: Observation) -> Observation:
    return observation


def _cannot_judge(why: str, cohorts: Cohorts) -> dict[str, Any]:
    return {
        "judge": {"outcome": ANALYSIS_INCONCLUSIVE, "score": None, "summary": why, "metrics": []},
        "cohorts": {
            "baseline": [m.key for m in cohorts.baseline],
            "canary": [m.key for m in cohorts.canary],
        },
        "error": why,
    }


# -- acting on the outcome -----------------------------------------------------------------------


def _conclude(refresh: PolicyRefresh, run: CanaryAnalysis | None, report: dict[str, Any]) -> str:
    verdict = report["judge"]
    outcome = verdict["outcome"]
    score = verdict.get("score")
    summary_text = str(verdict.get("summary") or "")[:SUMMARY_CHARS]
    with transaction.atomic():
        locked = locked_refresh(refresh)
        if run is not None:
            run.state = AnalysisRunState.FAILED if report.get("error") else AnalysisRunState.DONE
            run.outcome, run.score, run.summary = outcome, score, summary_text
            run.report, run.finished_at = report, timezone.now()
            run.save()
        if not _analysing(locked):
            # Aborted, rolled back by its deadline, or judged meanwhile: the report stays, the
            # refresh is not moved by a late analysis.
            return f"{outcome} (too late: the refresh is {locked.state})"
        ref = analysis_ref(locked)
        if run is not None:
            summary = summary_of(run)  # the row just written: the outcome's one record
        else:  # no template to make a run row with: the reference is the only record
            ref.update(CanaryAnalysisRef(outcome=outcome, score=score, summary=summary_text))
            summary = CanaryAnalysisSummary(
                template=ref.get("template", ""),
                outcome=outcome,
                score=score,
                summary=summary_text,
            )
        did = _act(locked, outcome, ref, summary, summary_text)
        # Audited last: the chain head is locked after the gates the outcome moved.
        audit_refresh(
            AuditAction.POLICY_REFRESH_ANALYSIS_DONE,
            locked,
            ANALYST,
            outcome=outcome,
            score=score,
            summary=summary_text,
            run=run.pk if run is not None else None,
        )
        publish_state_on_commit(locked)
    notify("refresh.analysis_done", refresh=locked, reason=f"{outcome}: {summary_text}")
    return did


def _act(
    refresh: PolicyRefresh,
    outcome: str,
    ref: CanaryAnalysisRef,
    summary: CanaryAnalysisSummary,
    text: str,
) -> str:
    """Move the locked refresh out of `analysing` by the outcome (see the module's doc). A
    verdict the analysis gives records the summary it rested on with it (`metrics`)."""
    evaluation = stored(refresh).canary.evaluation  # type: ignore[union-attr]
    metrics = {"analysis": dict(summary)}
    if outcome == ANALYSIS_FAIL:
        refresh.progress = with_canary_analysis(refresh, ref, state=CANARY_AWAITING)
        decide_locked(
            refresh, passed=False, metrics=metrics, actor=ANALYST, reason=f"analysis failed: {text}"
        )
        base.enqueue_execution(refresh.pk)
        return "failed: rolling the canary back"
    if outcome == ANALYSIS_PASS and evaluation == EVAL_NONE:
        refresh.progress = with_canary_analysis(refresh, ref, state=CANARY_AWAITING)
        decide_locked(
            refresh, passed=True, metrics=metrics, actor=ANALYST, reason=f"analysis passed: {text}"
        )
        base.enqueue_execution(refresh.pk)
        return "passed: the refresh goes on"
    needs_person = outcome != ANALYSIS_PASS
    refresh.progress = with_canary_analysis(
        refresh, ref, state=CANARY_AWAITING, needs_person=needs_person
    )
    refresh.save(update_fields=["progress"])
    why = (
        f"canary analysis {outcome}: a person decides ({text})"
        if needs_person
        else f"canary analysis passed; waiting for the {evaluation} verdict"
    )
    transaction.on_commit(lambda: notify("refresh.canary_review", refresh=refresh, reason=why))
    return why


# -- sweeping ------------------------------------------------------------------------------------


def requeue_stalled_analyses(now=None) -> list[int]:
    """Send again the analysis of a canary still `analysing` with no running run, once its
    first send is older than `STALL_AFTER` (a lost task; the row is the outbox)."""
    now = now or timezone.now()
    sent = []
    for refresh in PolicyRefresh.objects.filter(
        state=RefreshState.CANARY_REVIEW, state_changed_at__lt=now - STALL_AFTER
    ).order_by("id"):
        if not _analysing(refresh):
            continue
        run_id = analysis_ref(refresh).get("run_id")
        if (
            run_id
            and CanaryAnalysis.objects.filter(pk=run_id, state=AnalysisRunState.RUNNING).exists()
        ):
            continue
        jobs.send(ANALYSE_CANARY_TASK, refresh.pk)
        sent.append(refresh.pk)
    return sent
