"""A refresh's canary analyses in the API: the canary phase's report (both cohorts, the judge's
verdict per metric, the score and outcome, the prompts that moved most) and the watch after the
reopen (its ticks and breaches). Read-only: what to do about a marginal canary is the canary's
approve/reject (`/refreshes/{id}/canary/approve|reject`), and a template is edited under
`/sources/{name}/analysis-templates/`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router, Schema

from controlplane.accounts.roles import Perm
from controlplane.intake.api.auth import limit_to_sources, require
from controlplane.intake.api.errors import COMMON_ERRORS
from controlplane.refresh.models import CanaryAnalysis, PolicyRefresh

router = Router(tags=["canary analysis"])


class AnalysisOut(Schema):
    id: int
    phase: str
    state: str
    outcome: str
    score: float | None
    summary: str
    template: str
    template_version: int
    started_at: datetime
    finished_at: datetime | None
    report: dict[str, Any]


class AnalysesOut(Schema):
    refresh_id: int
    analyses: list[AnalysisOut]


def analysis_json(run: CanaryAnalysis) -> dict[str, Any]:
    return {
        "id": run.pk,
        "phase": run.phase,
        "state": run.state,
        "outcome": run.outcome,
        "score": run.score,
        "summary": run.summary,
        "template": run.template.name,
        "template_version": run.template.version,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "report": run.report or {},
    }


@router.get("/refreshes/{refresh_id}/analyses", response={200: AnalysesOut, **COMMON_ERRORS})
def list_analyses(request: HttpRequest, refresh_id: int):
    """Every analysis of one refresh, oldest first: the canary's, then the watch after it
    reopened. Each carries its full report."""
    require(request, Perm.VIEW)
    refresh = get_object_or_404(limit_to_sources(request, PolicyRefresh.objects), pk=refresh_id)
    runs = CanaryAnalysis.objects.filter(refresh=refresh).select_related("template")
    return {"refresh_id": refresh.pk, "analyses": [analysis_json(r) for r in runs]}
