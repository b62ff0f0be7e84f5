"""The capacity section of the refresh page: a stacked step chart and two small tables.

The chart stacks the engines running per version (oldest at the bottom) with the paused
workers on top, so the stack's height is always the planned workers; a dashed step line shows
how many of the running ones the gates admitted rollouts to. See `refresh.capacity` for what
each figure is derived from.

A chart is a few hundred pixels wide while a 2,000-worker refresh changes state ~4,000 times:
beyond one change per pixel column, each column shows its worst moment (most workers paused,
fewest admitted), so a short dip never disappears between two columns. The API serves every
change exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.utils.safestring import SafeString

from controlplane import charts
from controlplane.refresh.capacity import (
    UNKNOWN,
    Capacity,
    NamespaceGating,
    Point,
    Summary,
    WorkerPauses,
    capacity_of,
    worst_per_column,
)
from controlplane.refresh.models import TERMINAL_STATES, JournalEntry, PolicyRefresh

WIDTH = 640
#: Plot columns (the chart's width less its axis gutters: `charts.step_areas`).
COLUMNS = WIDTH - 44
#: Workers listed by paused time.
LONGEST = 10
PAUSED_CLASS = "chart-paused"
ADMITTED_CLASS = "chart-admitted"
#: How long a finished refresh's capacity section is kept (it never changes; a day bounds
#: the cache's memory to the refreshes people look at).
FINISHED_TTL = 24 * 3600


def _columns(cap: Capacity) -> list[tuple[float, Point, int]]:
    """(seconds from the start, the point drawn, admitted drawn), at most about one per pixel
    column (`capacity.worst_per_column`)."""
    return worst_per_column(cap, COLUMNS)


def version_class(cap: Capacity, version: str) -> str:
    if version == UNKNOWN:
        return "chart-failed"
    return charts.series_class(cap.versions.index(version))


def chart(cap: Capacity, refresh_id: int) -> SafeString:
    drawn = _columns(cap)
    times = [t for t, _, _ in drawn]
    layers = [
        charts.Layer(
            f"{version} running",
            version_class(cap, version),
            [p.running.get(version, 0) for _, p, _ in drawn],
        )
        for version in cap.versions
    ]
    layers.append(charts.Layer("paused", PAUSED_CLASS, [p.paused for _, p, _ in drawn]))
    admitted = charts.Layer("admitted by the gate", ADMITTED_CLASS, [a for _, _, a in drawn])
    return charts.step_areas(
        times,
        layers,
        line=admitted,
        span=cap.seconds,
        top=max(cap.summary.workers, 1),
        label=f"Workers running per version, paused and admitted during refresh #{refresh_id}",
        width=WIDTH,
    )


def _share(part: float | None) -> str:
    return "—" if part is None else f"{100 * part:.0f}%"


@dataclass(frozen=True, slots=True)
class GatedRow:
    gating: NamespaceGating
    share: str


@dataclass(frozen=True, slots=True)
class CapacityHead:
    """What the page reads of a `Capacity` besides the chart: kept small, because the page's
    view is cached and every viewer unpickles it (the full record is the API's)."""

    summary: Summary
    ongoing: bool


@dataclass(frozen=True, slots=True)
class CapacityView:
    cap: CapacityHead
    chart: SafeString
    gated: list[GatedRow]
    longest: list[WorkerPauses]
    lowest_running: str
    lowest_admitted: str
    mean_running: str
    mean_admitted: str


def view(refresh: PolicyRefresh) -> CapacityView | None:
    """What the page shows; None before the refresh started (nothing to measure).

    Shared through the cache (`view_key`): every viewer of a refresh redraws this on each of
    its state and step changes, and at 2,000 workers one computation costs tens of ms."""
    if refresh.started_at is None:
        return None
    key, timeout = view_key(refresh)
    shown = cache.get(key)
    if shown is None:
        shown = _view(refresh)
        cache.set(key, shown, timeout)
    return shown


def view_key(refresh: PolicyRefresh) -> tuple[str, int | None]:
    """(cache key, seconds to keep) of the page's capacity section of `refresh`.

    A finished refresh never changes (its window ends at `finished_at`, and its journal and
    gate history inside that window are written): keyed by its end, kept for a day. A live or
    held one is keyed by its state, wave and the journal's last row, so a new step or call is
    a new key, and kept `CAPACITY_LIVE_CACHE_SECONDS`: its open intervals run to "now", so
    the viewers of one moment share one computation and the next moment computes again."""
    if refresh.state in TERMINAL_STATES and refresh.finished_at is not None:
        return f"capacity-view:{refresh.pk}:end:{refresh.finished_at.timestamp()}", FINISHED_TTL
    last = (
        JournalEntry.objects.filter(refresh=refresh)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    return (
        f"capacity-view:{refresh.pk}:{refresh.state}:{refresh.wave}:{last or 0}",
        settings.CAPACITY_LIVE_CACHE_SECONDS,
    )


def _view(refresh: PolicyRefresh) -> CapacityView | None:
    cap = capacity_of(refresh)
    if cap is None:
        return None
    s = cap.summary
    span = cap.seconds
    return CapacityView(
        cap=CapacityHead(cap.summary, cap.ongoing),
        chart=chart(cap, refresh.pk),
        gated=[
            GatedRow(n, _share(n.gated_seconds / span if span else None)) for n in cap.namespaces
        ],
        longest=cap.longest_paused(LONGEST),
        lowest_running=_share(s.min_serving_fraction),
        lowest_admitted=_share(s.min_admitted_fraction),
        mean_running=_share(s.mean_serving_fraction),
        mean_admitted=_share(s.mean_admitted_fraction),
    )
