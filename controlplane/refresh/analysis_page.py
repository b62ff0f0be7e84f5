"""The canary analysis page of a refresh: what the judge saw and decided, and the watch after
the reopen (docs/concepts/canary-analysis.md).

Everything here is read from the `CanaryAnalysis` rows' reports as they were written when each
run ended: the page of a past refresh shows that past. The only "now" is the refresh's own
state, labelled as such in the header.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.utils.safestring import SafeString

from controlplane import charts
from controlplane.analysis.catalog import CATALOG
from controlplane.refresh.models import AnalysisPhase, CanaryAnalysis, PolicyRefresh


@dataclass(frozen=True)
class MetricRow:
    name: str
    what: str
    unit: str
    group: str
    verdict: str
    critical: bool
    p_value: float | None
    effect: float | None
    allowed_effect: float | None
    direction: str
    reason: str
    baseline_median: float | None
    canary_median: float | None
    n_baseline: int
    n_canary: int
    chart: SafeString


def _numbers(values: Any) -> list[float]:
    return [
        float(v)
        for v in values or []
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]


def metric_rows(run: CanaryAnalysis) -> list[MetricRow]:
    report = run.report or {}
    values = report.get("values") or {}
    base, canary = values.get("baseline") or {}, values.get("canary") or {}
    rows = []
    for m in (report.get("judge") or {}).get("metrics") or []:
        if not isinstance(m, dict):
            continue
        name = str(m.get("name", ""))
        info = CATALOG.get(name)
        b, c = _numbers(base.get(name)), _numbers(canary.get(name))
        rows.append(
            MetricRow(
                name=name,
                what=info.what if info else "",
                unit=info.unit if info else "",
                group=str(m.get("group", info.group if info else "")),
                verdict=str(m.get("verdict", "")),
                critical=bool(m.get("critical")),
                p_value=m.get("p_value"),
                effect=m.get("effect"),
                allowed_effect=m.get("allowed_effect"),
                direction=str(m.get("direction", "")),
                reason=str(m.get("reason", "")),
                baseline_median=m.get("median_baseline"),
                canary_median=m.get("median_canary"),
                n_baseline=int(m.get("n_baseline") or len(b)),
                n_canary=int(m.get("n_canary") or len(c)),
                chart=charts.cohort_strips(b, c, label=f"{name}: baseline and canary per prompt"),
            )
        )
    return rows


def page_context(refresh: PolicyRefresh) -> dict[str, Any]:
    runs = list(CanaryAnalysis.objects.filter(refresh=refresh).select_related("template"))
    canary = next((r for r in reversed(runs) if r.phase == AnalysisPhase.CANARY), None)
    watch = next((r for r in runs if r.phase == AnalysisPhase.BACKGROUND), None)
    report = (canary.report if canary else None) or {}
    return {
        "refresh": refresh,
        "canary_run": canary,
        "metrics": metric_rows(canary) if canary else [],
        "moved_most": report.get("moved_most") or [],
        "cohorts": report.get("cohorts") or {},
        "prompt_count": report.get("prompts"),
        "error": report.get("error", ""),
        "watch": watch,
        "ticks": list(reversed((watch.report or {}).get("ticks") or [])) if watch else [],
        "watch_breaches": (watch.report or {}).get("breaches") or [] if watch else [],
    }
