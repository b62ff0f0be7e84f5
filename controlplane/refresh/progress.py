"""`PolicyRefresh.progress`: what a staged refresh remembers between its waves.

This module owns the column's keys: its shape is `Progress` (and the canary's `CanaryReview`),
and every read or update goes through a helper here, so a key is spelled in one place and mypy
checks every write. Helpers that update return a new `Progress` (a copy): the caller stores it
with the transition or guarded update it is making, under the row lock it already holds.
"""

from __future__ import annotations

from typing import Any, TypedDict, cast

from django.utils import timezone

from controlplane.jsontypes import WeightVersion
from controlplane.refresh.targets import Target
from controlplane.textlimits import REASON_CHARS

#: A canary's review states (`CanaryReview.state`, and the `verdict` once one came).
CANARY_AWAITING = "awaiting"
CANARY_PASSED = "passed"
CANARY_FAILED = "failed"
#: The canary's statistical analysis runs (`strategy.canary.analysis`); no verdict is taken yet.
CANARY_ANALYSING = "analysing"

#: A canary analysis's outcomes (`analysis.judge`): pass, marginal, inconclusive, fail.
ANALYSIS_PASS = "pass"
ANALYSIS_MARGINAL = "marginal"
ANALYSIS_INCONCLUSIVE = "inconclusive"
ANALYSIS_FAIL = "fail"


class CanaryAnalysisRef(TypedDict, total=False):
    """Which analysis judges the canary: what the progress keeps of it. The run's outcome,
    score and summary are its `CanaryAnalysis` row's alone, read through
    `refresh.canary_review` (never copied here, so no path has two places to update)."""

    #: The `CanaryAnalysis` row, once the analysis task has created it.
    run_id: int
    #: The strategy's template name (what the run will use, before there is a run).
    template: str
    #: Only when no run row could be made (the template was gone): what the analysis
    #: concluded, which then has no other record.
    outcome: str
    score: float | None
    summary: str


class CanaryAnalysisSummary(TypedDict, total=False):
    """What the canary's analysis concluded, as the page and the API show it, derived from its
    `CanaryAnalysis` row (`refresh.canary_review`); the full report is that row."""

    #: The `CanaryAnalysis` row.
    run_id: int
    template: str
    template_version: int
    #: pass, marginal, inconclusive or fail (empty while it runs).
    outcome: str
    score: float | None
    summary: str


class CanaryReview(TypedDict, total=False):
    """The canary wave's evaluation, as the pages, the API and the trainer read it back."""

    #: awaiting (a verdict is due), passed or failed.
    state: str
    #: How it is judged: the strategy's `evaluation` (manual, trainer, ...).
    evaluation: str
    #: ISO time after which an absent verdict fails the canary.
    deadline: str
    #: The canary's verified instances, by namespace.
    instances: dict[str, list[str]]
    #: The verdict that came (passed or failed), its metrics, who gave it, when and why.
    verdict: str
    metrics: dict[str, Any] | None
    by: str
    at: str
    reason: str
    #: The statistical analysis of the canary, when the strategy asks for one: stored as a
    #: `CanaryAnalysisRef`; `refresh.canary_review` shows it as a `CanaryAnalysisSummary`.
    analysis: CanaryAnalysisRef | CanaryAnalysisSummary
    #: The analysis was marginal or inconclusive: a person decides (approve or reject),
    #: whatever `evaluation` says.
    needs_person: bool


#: An external update's apply states (`ExternalApply.state`).
APPLY_AWAITING = "awaiting"
APPLY_APPLIED = "applied"
APPLY_EXPIRED = "expired"
APPLY_ABORTED = "aborted"


class ApplyWorker(TypedDict):
    """One worker of an external update's set, as `refresh.ready_for_apply` names it."""

    instance_id: str
    namespace: str
    key: str
    family: str
    system_url: str


class ExternalApply(TypedDict, total=False):
    """An external update's wait for the trainer (`refresh/intents/external.py`)."""

    #: Which announcement this is: 1, then one more per retry of the update step.
    attempt: int
    #: awaiting (a report is due), applied (every worker reported), expired or aborted.
    state: str
    #: When `refresh.ready_for_apply` went out, and the ISO time after which it holds.
    requested_at: str
    deadline: str
    timeout_s: float
    #: The workers the trainer applies to (paused, owned by the refresh).
    workers: list[ApplyWorker]
    #: Worker key → `{"at", "by", "instance_id"}` of its `applied` report.
    applied: dict[str, dict[str, str]]
    #: Why the wait ended without every report (expired, aborted).
    reason: str


class Progress(TypedDict, total=False):
    """`PolicyRefresh.progress`; every key is optional (a refresh all at once has none)."""

    #: The gate's verified policy before a staged refresh began: what a failed canary and a
    #: rollback go back to (None: the scope had none).
    previous_policy: Target | None
    previous_version: WeightVersion
    #: A person asked to wait after the wave in progress.
    pause_requested: bool
    #: The wave the refresh waits after, at a pause point.
    waiting_after: int
    canary: CanaryReview
    #: An external update's wait for the trainer's `applied` report.
    external: ExternalApply


def progress_of(refresh) -> Progress:
    """A copy of the refresh's progress, to update and store."""
    return cast(Progress, dict(refresh.progress or {}))


def canary_of(refresh) -> CanaryReview | None:
    """A copy of the canary's review; None when the refresh has had no canary evaluation."""
    canary = (refresh.progress or {}).get("canary")
    return cast(CanaryReview, dict(canary)) if canary else None


def external_of(refresh) -> ExternalApply | None:
    """A copy of the external update's apply record; None before the first announcement."""
    external = (refresh.progress or {}).get("external")
    return cast(ExternalApply, dict(external)) if external else None


def with_external(refresh, external: ExternalApply) -> Progress:
    progress = progress_of(refresh)
    progress["external"] = external
    return progress


def previous_policy(refresh) -> Target | None:
    """The gate's verified policy from before the refresh (None when unknown or none)."""
    return (refresh.progress or {}).get("previous_policy")


def previous_version(refresh) -> WeightVersion | None:
    """The version the gate stood for before the refresh (None when unknown or none)."""
    return (refresh.progress or {}).get("previous_version")


def canary_deadline(refresh) -> str | None:
    return (canary_of(refresh) or {}).get("deadline")


def pause_is_requested(progress: Progress) -> bool:
    return bool(progress.get("pause_requested"))


def with_previous_policy(refresh, policy: Target | None) -> Progress:
    """Remember the gate's policy when the refresh first takes the gate (a retry keeps the
    first: by then the gate may stand for the new version)."""
    progress = progress_of(refresh)
    progress.setdefault("previous_policy", policy)
    progress.setdefault("previous_version", policy.get("weight_version") if policy else None)
    return progress


def with_pause_requested(refresh) -> Progress:
    progress = progress_of(refresh)
    progress["pause_requested"] = True
    return progress


def waiting_after(progress: Progress, wave: int) -> Progress:
    """At a pause point after `wave`: the request (if any) is served."""
    progress["pause_requested"] = False
    progress["waiting_after"] = wave
    return progress


def leaving_pause_point(refresh) -> tuple[Progress, int]:
    """The progress without its pause point, and the wave it waited after."""
    progress = progress_of(refresh)
    return progress, progress.pop("waiting_after", refresh.wave)


def with_canary(progress: Progress, canary: CanaryReview) -> Progress:
    progress["canary"] = canary
    return progress


def with_canary_verdict(
    refresh, *, passed: bool, metrics: dict[str, Any] | None, by: str, reason: str
) -> Progress:
    """The canary's verdict, given by a person, the trainer or the deadline."""
    progress = progress_of(refresh)
    outcome = CANARY_PASSED if passed else CANARY_FAILED
    canary = canary_of(refresh) or CanaryReview()
    canary.update(
        CanaryReview(
            verdict=outcome,
            metrics=metrics,
            by=by,
            at=timezone.now().isoformat(),
            reason=reason[:REASON_CHARS],
            state=outcome,
        )
    )
    return with_canary(progress, canary)


def analysis_ref(refresh) -> CanaryAnalysisRef:
    """Which analysis judges the refresh's canary (empty when none). A progress written
    before the outcome lived on the run alone may hold a whole summary; only the reference
    is read from it."""
    stored = (canary_of(refresh) or {}).get("analysis") or {}
    ref = CanaryAnalysisRef()
    if isinstance(stored.get("template"), str):
        ref["template"] = stored["template"]
    if isinstance(stored.get("run_id"), int):
        ref["run_id"] = stored["run_id"]
        return ref
    if stored.get("outcome"):  # concluded without a run row: this is its only record
        ref["outcome"] = str(stored["outcome"])
        score = stored.get("score")
        ref["score"] = score if isinstance(score, int | float) else None
        ref["summary"] = str(stored.get("summary") or "")
    return ref


def with_canary_analysis(
    refresh, ref: CanaryAnalysisRef, *, state: str, needs_person: bool = False
) -> Progress:
    """The canary's analysis, started (`state` analysing) or concluded (`state` awaiting a
    verdict; `needs_person` when a person must decide). What it concluded is its run's row."""
    progress = progress_of(refresh)
    canary = canary_of(refresh) or CanaryReview()
    canary.update(CanaryReview(state=state, analysis=ref, needs_person=needs_person))
    return with_canary(progress, canary)


def with_canary_failed(refresh, reason: str, by: str) -> Progress:
    """The canary failed its own checks (no verdict was asked: `verdict` stays unset)."""
    progress = progress_of(refresh)
    canary = canary_of(refresh) or CanaryReview()
    canary.update(
        CanaryReview(
            state=CANARY_FAILED, reason=reason[:REASON_CHARS], by=by, at=timezone.now().isoformat()
        )
    )
    return with_canary(progress, canary)
