"""When a running policy refresh should end: per-step medians of the source's history.

The estimate adds, for every step of the sequence not finished yet, the median duration that
step took in the last `HISTORY` successful refreshes of the same source; the step running now
counts for what its median leaves after the time it has already run (never below zero). Per
step rather than one median of whole refreshes scaled by a progress fraction: steps differ by
orders of magnitude (closing a gate takes milliseconds, updating weights minutes), so "half of
the steps done" says little about time, and a refresh that skips a step (a flush the update
already did) is still estimated from the steps it will run. No successful refresh of the
source yet: no estimate. Three queries; only while the refresh executes its sequence.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from controlplane.refresh.models import EXECUTING_STATES, PolicyRefresh, RefreshState, StepRun
from controlplane.refresh.step_order import ORDER

#: Past successful refreshes of the source the medians come from.
HISTORY = 20
_DONE = frozenset({"ok", "skipped"})


@dataclass(frozen=True, slots=True)
class Eta:
    remaining_seconds: float
    finish_at: dt.datetime
    #: How many past refreshes the medians come from.
    basis: int


def step_medians(refresh: PolicyRefresh) -> tuple[dict[str, float], int]:
    """Median seconds per step over the source's last successful refreshes, and how many."""
    past = list(
        PolicyRefresh.objects.filter(source_id=refresh.source_id, state=RefreshState.SUCCEEDED)
        .exclude(pk=refresh.pk)
        .order_by("-finished_at")
        .values_list("pk", flat=True)[:HISTORY]
    )
    durations: dict[str, list[float]] = defaultdict(list)
    for name, ms in StepRun.objects.filter(
        refresh_id__in=past, status="ok", duration_ms__isnull=False
    ).values_list("name", "duration_ms"):
        if ms is not None:  # filtered above; the column is nullable
            durations[name].append(ms / 1000)
    return {name: statistics.median(values) for name, values in durations.items()}, len(past)


def _not_estimating(refresh: PolicyRefresh) -> str | None:
    """Why a refresh in this state has no estimate (None: it runs its sequence)."""
    if refresh.state == RefreshState.RELEASING:
        return "the refresh is being closed out (releasing the engines it paused)"
    if refresh.state == RefreshState.ABORTING:
        return "the refresh is aborting (cancelling its calls in flight)"
    if refresh.state not in EXECUTING_STATES:
        return f"the refresh is {refresh.state}, not running its steps"
    return None


def estimate(refresh: PolicyRefresh, *, now: dt.datetime | None = None) -> Eta | None:
    """The estimate, or None when there is nothing to estimate from or nothing running."""
    if _not_estimating(refresh) is not None:
        return None
    medians, basis = step_medians(refresh)
    if not basis:
        return None
    now = now or timezone.now()
    latest: dict[str, StepRun] = {}
    for run in StepRun.objects.filter(refresh=refresh).order_by("id"):
        latest[run.name] = run
    remaining = 0.0
    for step in ORDER:
        found = latest.get(step.value)
        if found is not None and found.status in _DONE:
            continue
        median = medians.get(step.value, 0.0)
        if found is not None and found.status == "running":
            median -= (now - found.started_at).total_seconds()
        remaining += max(median, 0.0)
    return Eta(remaining, now + dt.timedelta(seconds=remaining), basis)


def basis_text(basis: int) -> str:
    """What the estimate rests on, in the refresh page's words."""
    return (
        f"per-step medians of the last {basis} successful "
        f"refresh{'' if basis == 1 else 'es'} of this source"
    )


#: Why there is no estimate when the source has never refreshed successfully.
NO_HISTORY = "no successful refresh of this source yet to estimate from"


def eta_json(refresh: PolicyRefresh, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """The estimate as `refresh status --json` and the refresh API give it: `estimated_end`,
    `remaining_seconds`, `basis` (the page's words) and `history` (how many refreshes); when
    there is none those are null and `reason` says why."""
    reason = _not_estimating(refresh)
    found = None if reason else estimate(refresh, now=now)
    if found is None:
        return {
            "estimated_end": None,
            "remaining_seconds": None,
            "basis": None,
            "history": None if reason else 0,
            "reason": reason or NO_HISTORY,
        }
    return {
        "estimated_end": found.finish_at,
        "remaining_seconds": round(found.remaining_seconds, 1),
        "basis": basis_text(found.basis),
        "history": found.basis,
        "reason": None,
    }
