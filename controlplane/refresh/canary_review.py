"""The canary's review as the refresh page and the API show it: the progress's review, with
its analysis read from the analysis's own row.

`PolicyRefresh.progress` keeps only which analysis judges the canary (`CanaryAnalysisRef`);
what it concluded (outcome, score, summary) and the template version it ran with are the
`CanaryAnalysis` row's, written once by `intents/analysis.py`. So a re-read of the row is
the only way to the outcome, and no path has a second copy to keep in step.
"""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from controlplane.refresh.models import CanaryAnalysis, PolicyRefresh
from controlplane.refresh.progress import (
    CanaryAnalysisSummary,
    CanaryReview,
    analysis_ref,
    canary_of,
)

#: What a review reads of a run: never its report (the analysis page's, and large).
_RUN_FIELDS = (
    "id",
    "refresh_id",
    "outcome",
    "score",
    "summary",
    "template__name",
    "template__version",
)


def _runs() -> QuerySet[CanaryAnalysis]:
    return CanaryAnalysis.objects.select_related("template").only(*_RUN_FIELDS)


def with_runs(refreshes: QuerySet[PolicyRefresh]) -> QuerySet[PolicyRefresh]:
    """`refreshes` with their analysis runs read in one query for the whole list (a page of
    the API's refresh list shows each one's review)."""
    return refreshes.prefetch_related(Prefetch("analyses", queryset=_runs()))


def summary_of(run: CanaryAnalysis) -> CanaryAnalysisSummary:
    return CanaryAnalysisSummary(
        run_id=run.pk,
        template=run.template.name,
        template_version=run.template.version,
        outcome=run.outcome,
        score=run.score,
        summary=run.summary,
    )


def _run(refresh: PolicyRefresh, run_id: int) -> CanaryAnalysis | None:
    prefetched = getattr(refresh, "_prefetched_objects_cache", {}).get("analyses")
    if prefetched is not None:
        return next((run for run in prefetched if run.pk == run_id), None)
    return _runs().filter(refresh=refresh, pk=run_id).first()


def review(refresh: PolicyRefresh) -> CanaryReview | None:
    """The canary's review with its analysis as a `CanaryAnalysisSummary`; None when the
    refresh has had no canary evaluation. One query when the analysis has a run (none when
    `with_runs` read it already)."""
    canary = canary_of(refresh)
    if canary is None or "analysis" not in canary:
        return canary
    ref = analysis_ref(refresh)
    run = _run(refresh, ref["run_id"]) if "run_id" in ref else None
    if run is not None:
        canary["analysis"] = summary_of(run)
    else:  # no run yet (the task has not started it), or none could be made
        canary["analysis"] = CanaryAnalysisSummary(
            template=ref.get("template", ""),
            outcome=ref.get("outcome", ""),
            score=ref.get("score"),
            summary=ref.get("summary", ""),
        )
    return canary
