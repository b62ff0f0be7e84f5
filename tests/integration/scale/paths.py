"""The paths kept flat, each as a function that runs it once on a built `Scenario`: shared by
`test_new_paths_flat.py` (statements at 100 and 2,000 workers) and `bench/new_paths.py`
(statements and time up to 10,000).

Reads go through what their users call: the JSON API and the pages through Django's full
stack (a signed-in viewer's `Client`), the metrics collector as /metrics runs it. Writes are
the real writers: the gate step and the reopen of a refresh (`refresh/gates.py` writing the
ledger) and the bookkeeping of a canary analysis (`run_canary_analysis` with the prompts'
collection replaced: it is HTTP to the frontend, no SQL, and it is not what is counted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.test import Client
from django.utils import timezone

from controlplane.analysis.services import save_template
from controlplane.refresh import gates, windows
from controlplane.refresh.analysis_page import page_context
from controlplane.refresh.intents import analysis
from controlplane.refresh.lag_metrics import LagCollector
from controlplane.refresh.models import (
    AnalysisPhase,
    CanaryAnalysis,
    PolicyRefresh,
    RefreshState,
)
from controlplane.refresh.progress import (
    ANALYSIS_INCONCLUSIVE,
    CANARY_ANALYSING,
    CanaryReview,
    with_canary,
)
from tests.integration.scale import fleet as build
from tests.integration.scale.fleet import TEMPLATE, Fleet

#: The canary wave is every tenth worker; the others are the baseline on the old policy.
CANARY_STRATEGY = {
    "kind": "canary",
    "canary": {"size": 1, "evaluation": "none", "analysis": TEMPLATE, "timeout_seconds": 600},
}
PROMPTS = 24


@dataclass
class Scenario:
    fleet: Fleet
    refresh: PolicyRefresh
    canary: PolicyRefresh
    client: Client
    #: Statements of the writes made while building (the ledger's, once each).
    built: dict[str, int]
    #: An instance id and a moment inside its serving history.
    instance_id: str = ""


def scenario(n: int, client: Client, name: str = "") -> Scenario:
    """A fleet of `n` workers refreshed from `OLD` to `Fleet.new` (ledger written by the gate
    step and the reopen), three published policies, and a canary refresh waiting for its
    analysis."""
    f = build.fleet(n, name)
    built: dict[str, int] = {}
    built["ledger: discovery records the fleet"], _ = build.count(lambda: build.discovered(f))
    refresh = build.finished_refresh(f)
    built["ledger: refresh closes the gates"], _ = build.count(lambda: build.close(refresh))
    built["ledger: refresh reopens, verified"], _ = build.count(lambda: build.reopen(f, refresh))
    PolicyRefresh.objects.filter(pk=refresh.pk).update(
        state=RefreshState.SUCCEEDED, finished_at=timezone.now()
    )
    build.published(f)
    save_template(
        f.source,
        TEMPLATE,
        {"prompts": _prompts(), "max_tokens": 8},
        actor=build.ACTOR,
    )
    canary = build.finished_refresh(
        f,
        version=f"v3-{f.source.name}",
        state=RefreshState.CANARY_REVIEW,
        strategy=CANARY_STRATEGY,
        waves=2,
    )
    # The canary wave: every tenth worker (`finished_refresh` plans them in wave 1).
    canary_wave: dict[str, list[str]] = {}
    for ns, iid, _ in f.instances[::10]:
        canary_wave.setdefault(ns, []).append(iid)
    built["ledger: staged refresh takes the gates"], _ = build.count(
        lambda: gates.begin_staged(canary, actor=build.ACTOR, reason="canary", waves=2)
    )
    built["ledger: canary wave paused"], _ = build.count(
        lambda: gates.stage_wave(canary, 1, canary_wave, reason="canary wave")
    )
    built["ledger: canary wave verified"], _ = build.count(
        lambda: gates.wave_verified(canary, canary_wave, admit=False, reason="canary verified")
    )
    # An instance of the baseline (not in the canary wave): admitted at the new version.
    return Scenario(f, refresh, canary, client, built, instance_id=f.instances[n // 2 + 1][1])


def _prompts() -> list[dict[str, Any]]:
    return [{"prompt": [300 + i, 301 + i, 302 + i], "continuation": None} for i in range(PROMPTS)]


def _get(s: Scenario, url: str) -> bytes:
    response = s.client.get(url)
    assert response.status_code == 200, (url, response.status_code, response.content[:300])
    return response.content


# -- the serving ledger ---------------------------------------------------------------------


def ledger_close_reopen(s: Scenario) -> None:
    """One more gate step and reopen of the refresh: every instance withdrawn, then verified."""
    build.close(s.refresh)
    build.reopen(s.fleet, s.refresh)


def ledger_served_at(s: Scenario) -> list:
    """Which version could instance X have served during the last hour (every interval)."""
    now = timezone.now()
    found = windows.served_at(
        s.instance_id, now - timedelta(hours=1), now, source_ids=[s.fleet.source.pk]
    )
    assert found and s.fleet.new in found[-1].versions, found
    return found


def ledger_worker_windows(s: Scenario) -> list:
    """Where and when the new version was served, per instance."""
    found = windows.worker_windows(s.fleet.new, source_ids=[s.fleet.source.pk])
    assert len(found) == s.fleet.size, len(found)
    return found


def ledger_admission_windows(s: Scenario) -> list:
    """When each namespace's gate admitted the new version."""
    found = windows.admission_windows(s.fleet.new, source_ids=[s.fleet.source.pk])
    assert {w.namespace for w in found} == set(s.fleet.namespaces), found
    return found


def ledger_admitted_at(s: Scenario) -> dict:
    found = windows.admitted_at(s.fleet.source, s.fleet.namespaces, timezone.now())
    assert sum(len(v) for v in found.values()) > s.fleet.size // 2
    return found


# -- provenance ------------------------------------------------------------------------------


def provenance_instance_api(s: Scenario) -> bytes:
    at = timezone.now().isoformat()
    return _get(s, f"/api/v1/provenance?instance_id={s.instance_id}&at={at.replace('+', '%2B')}")


def provenance_version_api(s: Scenario) -> bytes:
    body = _get(s, f"/api/v1/versions/{s.fleet.new}/provenance")
    return body


def provenance_version_page(s: Scenario) -> bytes:
    return _get(s, f"/versions/{s.fleet.new}/provenance/")


def provenance_search(s: Scenario) -> bytes:
    # A version prefix, a namespace prefix and an instance id prefix in turn.
    return b"".join(
        _get(s, f"/search/?q={q}") for q in ("v", s.fleet.namespaces[1], s.instance_id[:2])
    )


# -- policy lag ------------------------------------------------------------------------------


def lag_api(s: Scenario) -> bytes:
    body = _get(s, f"/api/v1/gates?source={s.fleet.source.name}")
    assert b'"policy_lag": {' in body or b'"policy_lag":{' in body, body[:300]
    return body


def lag_page(s: Scenario) -> bytes:
    return _get(s, "/refreshes/gates/")


def lag_metrics(s: Scenario) -> list:
    families = list(LagCollector().collect())
    assert families[0].samples, families
    return families


# -- canary analysis -------------------------------------------------------------------------


def _collected(refresh, spec, cohorts) -> dict[str, Any]:
    """What `analysis.analyse` returns, without the prompts' HTTP: per-prompt values for both
    cohorts and an inconclusive verdict (a person decides: no executor is enqueued)."""
    values = {"ref_logprob": [-1.0] * PROMPTS, "latency_ms": [20.0] * PROMPTS}
    return {
        "judge": {
            "outcome": ANALYSIS_INCONCLUSIVE,
            "score": 80.0,
            "summary": "a person decides",
            "metrics": [
                {
                    "name": name,
                    "verdict": "pass",
                    "group": "drift",
                    "p_value": 0.5,
                    "effect": 0.0,
                    "median_baseline": v[0],
                    "median_canary": v[0],
                    "n_baseline": PROMPTS,
                    "n_canary": PROMPTS,
                }
                for name, v in values.items()
            ],
        },
        "cohorts": {
            "baseline": [m.key for m in cohorts.baseline],
            "canary": [m.key for m in cohorts.canary],
        },
        "values": {"baseline": values, "canary": values},
        "moved_most": [],
        "prompts": PROMPTS,
    }


def canary_bookkeeping(s: Scenario) -> str:
    """One canary analysis run end to end but for its HTTP: the cohorts, the run row, the
    report, the outcome acted on, the audit rows."""
    progress = with_canary({}, CanaryReview(state=CANARY_ANALYSING))
    PolicyRefresh.objects.filter(pk=s.canary.pk).update(
        progress=progress, state=RefreshState.CANARY_REVIEW
    )
    original = analysis.analyse
    analysis.analyse = _collected  # type: ignore[assignment]
    try:
        did = analysis.run_canary_analysis(s.canary.pk)
    finally:
        analysis.analyse = original  # type: ignore[assignment]
    assert "a person decides" in did, did
    return did


def canary_cohorts(s: Scenario) -> analysis.Cohorts:
    found = analysis.canary_cohorts(s.canary)
    # Every tenth worker is the canary; the live ones of the others (`make_fleet`: every fifth
    # worker is erroring) are the baseline.
    assert len(found.canary) == len(range(0, s.fleet.size, 10))
    assert len(found.baseline) == len([i for i in range(s.fleet.size) if i % 5])
    return found


def _ensure_report(s: Scenario) -> None:
    if not CanaryAnalysis.objects.filter(refresh=s.canary, phase=AnalysisPhase.CANARY).exists():
        canary_bookkeeping(s)


def canary_page(s: Scenario) -> bytes:
    return _get(s, f"/refreshes/{s.canary.pk}/analysis/")


def canary_api(s: Scenario) -> bytes:
    return _get(s, f"/api/v1/refreshes/{s.canary.pk}/analyses")


def canary_page_context(s: Scenario) -> dict:
    return page_context(s.canary)


#: name → (the path, what it needs done first, untimed and uncounted).
PATHS: dict[str, tuple[Callable[[Scenario], object], Callable[[Scenario], None] | None]] = {
    "ledger: gate step + reopen": (ledger_close_reopen, None),
    "ledger: served_at (one instance)": (ledger_served_at, None),
    "ledger: worker windows of a version": (ledger_worker_windows, None),
    "ledger: admission windows": (ledger_admission_windows, None),
    "ledger: admitted at a moment": (ledger_admitted_at, None),
    "provenance: instance API": (provenance_instance_api, None),
    "provenance: version API (batch)": (provenance_version_api, None),
    "provenance: version page": (provenance_version_page, None),
    "provenance: search": (provenance_search, None),
    "policy lag: gates API": (lag_api, None),
    "policy lag: gates page": (lag_page, None),
    "policy lag: /metrics collector": (lag_metrics, None),
    "canary: analysis bookkeeping": (canary_bookkeeping, None),
    "canary: cohorts": (canary_cohorts, None),
    "canary: report page": (canary_page, _ensure_report),
    "canary: analyses API": (canary_api, _ensure_report),
}
