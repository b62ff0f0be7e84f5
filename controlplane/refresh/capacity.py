"""Capacity and goodput of one policy refresh, derived from what happened, never from the plan.

Sources of truth (so the figures hold for every way a refresh can run: all at once, in waves, a
canary first, retried, taken over after a crash, released):

- the call journal: a worker **stops serving** when a `pause` call to it succeeds and **serves
  again** when a `resume` call succeeds (the planner ends every family's resume step with
  `resume`, after any memory re-occupation; a release journals the same calls). A failed call
  changes nothing: only what a worker confirmed counts, so a worker whose resume failed stays
  paused, and one whose pause failed kept serving. A worker never resumed stays paused until
  the refresh's end (or now, while it is still active).
- the journal's `update` step: what a worker serves once running again. Each (worker, attempt)
  run of the step decides: every call ok → the refresh's version; any call failed → unknown
  (the engine may hold part of the new weights). Before that it serves its namespace's previous
  verified version.
- the serving ledger's admission windows (`ServingInterval`, the one record of what each gate
  admitted): per namespace, when rollouts were admitted. A namespace is *gated* while the
  ledger admits none of its instances (its gate closed, or never verified); its version before
  the refresh is the one most of its instances were admitted at when the refresh started.

"Serving" is shown twice, because an engine running is not a rollout admitted: **engines
running** (per version) counts every worker not paused; **admitted** counts those whose
namespace gate admits rollouts at that moment. During an all-at-once refresh the engines come
back at resume, but nothing is admitted until the reopen after verification; trainers lose the
admitted capacity, the fleet the running one.

The window is the refresh's own: from its start to its end (now while it runs or is held), so
a gate closed before the refresh counts only from the start, and one left closed after the end
only to the end.

`compute` is pure (plain rows in, a `Capacity` out) and linear in the journal; `capacity_of`
feeds it with four queries whatever the fleet size, streaming the journal as tuples.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db.models import Q
from django.utils import timezone

from controlplane.refresh.models import (
    ADMITTING_STATES,
    Admission,
    GateState,
    JournalEntry,
    PlannedWorker,
    PolicyRefresh,
    Serving,
    ServingInterval,
)

PAUSE_OPERATION = "pause"
RESUME_OPERATION = "resume"
UPDATE_STEP = "update"
#: The series of a worker before its update when its namespace's gate never verified a version.
PREVIOUS = "previous"
#: The series of a worker whose latest update run failed: what it serves is not known.
UNKNOWN = "unknown (update failed)"
#: The API's series at most this many points: a refresh changes state up to about three
#: times per worker (pause, update, resume), ~30,000 points at 10,000 workers.
SERIES_POINTS = 1000
_ADMITTING = frozenset(str(s) for s in ADMITTING_STATES)


class Worker(NamedTuple):
    id: int
    key: str
    namespace: str


class Call(NamedTuple):
    """The journal columns the computation reads (`JournalEntry`)."""

    worker_id: int
    step: str
    attempt: int
    operation: str
    ok: bool
    finished_at: dt.datetime


class GateChange(NamedTuple):
    namespace: str
    at: dt.datetime
    state: str
    verified_version: Any = None


class GateStart(NamedTuple):
    """A namespace's gate as the refresh found it (a gate never written: open, nothing verified)."""

    state: str = GateState.OPEN.value
    verified_version: Any = None


@dataclass(frozen=True, slots=True)
class Interval:
    start: dt.datetime
    #: None: still open at the end of the window (never resumed / still gated).
    end: dt.datetime | None

    def seconds(self, window_end: dt.datetime) -> float:
        return max(0.0, ((self.end or window_end) - self.start).total_seconds())

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat() if self.end else None}


@dataclass(frozen=True, slots=True)
class WorkerPauses:
    key: str
    namespace: str
    intervals: tuple[Interval, ...]
    paused_seconds: float
    #: What it serves at the end of the window (or would serve, if it is still paused).
    version: str

    @property
    def paused_at_end(self) -> bool:
        return bool(self.intervals) and self.intervals[-1].end is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "namespace": self.namespace,
            "paused_seconds": round(self.paused_seconds, 3),
            "paused_at_end": self.paused_at_end,
            "version": self.version,
            "intervals": [i.as_dict() for i in self.intervals],
        }


@dataclass(frozen=True, slots=True)
class Point:
    """The fleet from `at` until the next point: engines running per version, paused,
    admitted (running and in a namespace whose gate admits)."""

    at: dt.datetime
    running: Mapping[str, int]
    paused: int
    admitted: int

    @property
    def serving(self) -> int:
        return sum(self.running.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "running": dict(self.running),
            "paused": self.paused,
            "admitted": self.admitted,
        }


@dataclass(frozen=True, slots=True)
class NamespaceGating:
    namespace: str
    intervals: tuple[Interval, ...]
    gated_seconds: float

    @property
    def gated_at_end(self) -> bool:
        return bool(self.intervals) and self.intervals[-1].end is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "gated_seconds": round(self.gated_seconds, 3),
            "gated_at_end": self.gated_at_end,
            "intervals": [i.as_dict() for i in self.intervals],
        }


@dataclass(frozen=True, slots=True)
class Summary:
    workers: int
    paused_workers: int
    paused_at_end: int
    peak_unavailable: int
    peak_unavailable_at: dt.datetime | None
    worker_seconds_paused: float
    #: Lowest share of the planned workers with their engine running / admitted; None: no workers.
    min_serving_fraction: float | None
    min_admitted_fraction: float | None
    #: Time-weighted shares over the window (1.0: nothing lost).
    mean_serving_fraction: float | None
    mean_admitted_fraction: float | None
    first_pause_at: dt.datetime | None
    last_resume_at: dt.datetime | None
    #: Over the workers that were paused at all.
    paused_seconds_min: float | None
    paused_seconds_median: float | None
    paused_seconds_max: float | None

    def as_dict(self) -> dict[str, Any]:
        def iso(value: dt.datetime | None) -> str | None:
            return value.isoformat() if value else None

        def r(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        return {
            "workers": self.workers,
            "paused_workers": self.paused_workers,
            "paused_at_end": self.paused_at_end,
            "peak_unavailable": self.peak_unavailable,
            "peak_unavailable_at": iso(self.peak_unavailable_at),
            "worker_seconds_paused": round(self.worker_seconds_paused, 3),
            "min_serving_fraction": r(self.min_serving_fraction),
            "min_admitted_fraction": r(self.min_admitted_fraction),
            "mean_serving_fraction": r(self.mean_serving_fraction),
            "mean_admitted_fraction": r(self.mean_admitted_fraction),
            "first_pause_at": iso(self.first_pause_at),
            "last_resume_at": iso(self.last_resume_at),
            "paused_seconds": {
                "min": r(self.paused_seconds_min),
                "median": r(self.paused_seconds_median),
                "max": r(self.paused_seconds_max),
            },
        }


@dataclass(frozen=True, slots=True)
class Capacity:
    start: dt.datetime
    end: dt.datetime
    #: The refresh is still active: `end` is now and open intervals run on.
    ongoing: bool
    #: Series names, oldest first: previous versions, then the refresh's, then unknown.
    versions: tuple[str, ...]
    target_version: str
    points: tuple[Point, ...]
    workers: tuple[WorkerPauses, ...]
    namespaces: tuple[NamespaceGating, ...]
    summary: Summary

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())

    def longest_paused(self, n: int = 10) -> list[WorkerPauses]:
        paused = [w for w in self.workers if w.intervals]
        return sorted(paused, key=lambda w: (-w.paused_seconds, w.key))[:n]

    def series(self, most: int = SERIES_POINTS) -> tuple[tuple[Point, ...], bool]:
        """The step series, and whether it is every change: beyond `most` changes, one point
        per slice of the window with its worst moment (`worst_per_column`), each slice's
        point placed at the slice's start."""
        if len(self.points) <= most:
            return self.points, True
        coarse = tuple(
            Point(self.start + dt.timedelta(seconds=t), p.running, p.paused, admitted)
            for t, p, admitted in worst_per_column(self, most - 1)
        )
        return coarse, False

    def as_dict(self, workers: slice = slice(None)) -> dict[str, Any]:
        """Everything but the workers, and the workers in `workers` (a page of them: the
        rest's dicts are never built)."""
        points, exact = self.series()
        return {
            "window": {
                "start": self.start.isoformat(),
                "end": self.end.isoformat(),
                "seconds": round(self.seconds, 3),
                "ongoing": self.ongoing,
            },
            "versions": list(self.versions),
            "target_version": self.target_version,
            "summary": self.summary.as_dict(),
            "series": [p.as_dict() for p in points],
            "series_exact": exact,
            "namespaces": [n.as_dict() for n in self.namespaces],
            "workers": [w.as_dict() for w in self.workers[workers]],
        }


def worst_per_column(cap: Capacity, columns: int) -> list[tuple[float, Point, int]]:
    """The series in at most about `columns` slices of the window: (seconds from the start,
    the slice's most-paused point, its fewest admitted). Beyond one change per slice each
    shows its worst moment, so a short dip never disappears between two; the state a slice's
    last change left is carried to the next slice (else the dip would last until the next
    change). The chart draws one slice per pixel column; the API bounds its series so."""
    step = (cap.seconds or 1.0) / columns
    # Per column: [start, drawn point, drawn admitted, column, last point].
    cells: list[list[Any]] = []

    def add(t: float, point: Point) -> None:
        column = min(int(t / step), columns)
        if cells and cells[-1][3] == column:
            cell = cells[-1]
            if point.paused > cell[1].paused:
                cell[1] = point
            cell[2] = min(cell[2], point.admitted)
            cell[4] = point
            return
        if cells and carry(cells[-1]):
            add(t, point)  # into the carried column, or a fresh one after it
            return
        cells.append([t, point, point.admitted, column, point])

    def carry(cell: list[Any]) -> bool:
        last = cell[4]
        if last is cell[1] and last.admitted == cell[2]:
            return False
        cells.append([(cell[3] + 1) * step, last, last.admitted, cell[3] + 1, last])
        return True

    for point in cap.points:
        add((point.at - cap.start).total_seconds(), point)
    if cells and (cells[-1][3] + 1) * step < cap.seconds:
        carry(cells[-1])
    return [(cell[0], cell[1], cell[2]) for cell in cells]


def version_label(version: Any) -> str:
    return PREVIOUS if version is None else str(version)


# -- the computation ------------------------------------------------------------------------

_GATE, _VERSION, _PAUSE, _RESUME = range(4)


def _update_verdicts(calls: Iterable[Call]) -> tuple[list[tuple], list[tuple]]:
    """Pause and resume events (time, kind, worker) from the ok calls, and one version event per
    (worker, attempt) run of the update step: (time, kind, worker, succeeded)."""
    events: list[tuple] = []
    runs: dict[tuple[int, int], list[Any]] = {}
    for call in calls:
        if call.step == UPDATE_STEP:
            run = runs.setdefault((call.worker_id, call.attempt), [True, call.finished_at])
            run[0] = run[0] and call.ok
            run[1] = max(run[1], call.finished_at)
        elif call.ok and call.operation == PAUSE_OPERATION:
            events.append((call.finished_at, _PAUSE, call.worker_id))
        elif call.ok and call.operation == RESUME_OPERATION:
            events.append((call.finished_at, _RESUME, call.worker_id))
    versions = [(at, _VERSION, wid, ok) for (wid, _attempt), (ok, at) in runs.items()]
    return events, versions


def compute(
    *,
    workers: Sequence[Worker],
    calls: Iterable[Call],
    gate_start: Mapping[str, GateStart],
    gate_changes: Iterable[GateChange],
    namespaces: Sequence[str],
    target_version: Any,
    start: dt.datetime,
    end: dt.datetime,
    ongoing: bool = False,
) -> Capacity:
    """The capacity of one refresh from its journal and its gate history (see the module)."""
    target = str(target_version)
    namespaces = list(dict.fromkeys([*namespaces, *(w.namespace for w in workers)]))
    starts = {ns: gate_start.get(ns, GateStart()) for ns in namespaces}
    previous = {ns: version_label(s.verified_version) for ns, s in starts.items()}

    moves, version_events = _update_verdicts(calls)
    events: list[tuple] = [e for e in moves + version_events if e[0] <= end]
    events += [
        (g.at, _GATE, g.namespace, g.state)
        for g in gate_changes
        if start <= g.at <= end and g.namespace in starts
    ]
    # Same instant: gates first, then versions, pauses, resumes (the point is taken after all).
    events.sort(key=lambda e: (e[0], e[1]))
    start = min(start, events[0][0]) if events else start

    by_id = {w.id: w for w in workers}
    version = {w.id: previous[w.namespace] for w in workers}
    paused_since: dict[int, dt.datetime] = {}
    intervals: dict[int, list[Interval]] = defaultdict(list)
    running: Counter[str] = Counter(version.values())
    running_ns: Counter[str] = Counter(w.namespace for w in workers)
    admitting = {ns: s.state in _ADMITTING for ns, s in starts.items()}
    gated_since: dict[str, dt.datetime] = {ns: start for ns, ok in admitting.items() if not ok}
    gated: dict[str, list[Interval]] = defaultdict(list)
    first_pause: dt.datetime | None = None
    last_resume: dt.datetime | None = None

    def admitted() -> int:
        return sum(n for ns, n in running_ns.items() if admitting.get(ns, True))

    points = [Point(start, _positive(running), 0, admitted())]
    i = 0
    while i < len(events):
        at = events[i][0]
        while i < len(events) and events[i][0] == at:
            event = events[i]
            i += 1
            kind = event[1]
            if kind == _GATE:
                ns, is_open = event[2], event[3] in _ADMITTING
                if is_open and not admitting[ns]:
                    gated[ns].append(Interval(gated_since.pop(ns), at))
                elif not is_open and admitting[ns]:
                    gated_since[ns] = at
                admitting[ns] = is_open
                continue
            wid = event[2]
            if wid not in by_id:
                continue  # a journal row of a worker not in the plan: nothing to count it in
            if kind == _VERSION:
                new = target if event[3] else UNKNOWN
                if wid not in paused_since:
                    running[version[wid]] -= 1
                    running[new] += 1
                version[wid] = new
            elif kind == _PAUSE and wid not in paused_since:
                paused_since[wid] = at
                running[version[wid]] -= 1
                running_ns[by_id[wid].namespace] -= 1
                first_pause = first_pause or at
            elif kind == _RESUME and wid in paused_since:
                intervals[wid].append(Interval(paused_since.pop(wid), at))
                running[version[wid]] += 1
                running_ns[by_id[wid].namespace] += 1
                last_resume = at
        point = Point(at, _positive(running), len(paused_since), admitted())
        last = points[-1]
        if (point.running, point.paused, point.admitted) != (
            last.running,
            last.paused,
            last.admitted,
        ):
            points.append(point)
    for wid, since in paused_since.items():
        intervals[wid].append(Interval(since, None))
    for ns, since in gated_since.items():
        gated[ns].append(Interval(since, None))

    pauses = tuple(
        WorkerPauses(
            w.key,
            w.namespace,
            tuple(intervals.get(w.id, ())),
            sum(iv.seconds(end) for iv in intervals.get(w.id, ())),
            version[w.id],
        )
        for w in workers
    )
    gating = tuple(
        NamespaceGating(ns, tuple(spans), sum(iv.seconds(end) for iv in spans))
        for ns in namespaces
        for spans in [gated.get(ns, [])]
    )
    versions = [v for v in dict.fromkeys(previous.values()) if v != target]
    versions.append(target)
    if any(v == UNKNOWN for v in version.values()):
        versions.append(UNKNOWN)
    return Capacity(
        start=start,
        end=end,
        ongoing=ongoing,
        versions=tuple(versions),
        target_version=target,
        points=tuple(points),
        workers=pauses,
        namespaces=gating,
        summary=_summary(len(workers), points, pauses, start, end, first_pause, last_resume),
    )


def _positive(counter: Counter[str]) -> dict[str, int]:
    return {k: n for k, n in sorted(counter.items()) if n > 0}


def _summary(
    n: int,
    points: list[Point],
    pauses: tuple[WorkerPauses, ...],
    start: dt.datetime,
    end: dt.datetime,
    first_pause: dt.datetime | None,
    last_resume: dt.datetime | None,
) -> Summary:
    peak = max(points, key=lambda p: p.paused)  # the first of the highest
    paused = sorted(w.paused_seconds for w in pauses if w.intervals)
    span = (end - start).total_seconds()
    if n and span > 0:
        bounds = [p.at for p in points[1:]] + [end]
        served = admitted = 0.0
        for point, until in zip(points, bounds, strict=True):
            secs = (until - point.at).total_seconds()
            served += point.serving * secs
            admitted += point.admitted * secs
        mean_serving: float | None = served / (n * span)
        mean_admitted: float | None = admitted / (n * span)
    else:
        mean_serving = mean_admitted = 1.0 if n else None
    return Summary(
        workers=n,
        paused_workers=len(paused),
        paused_at_end=sum(1 for w in pauses if w.paused_at_end),
        peak_unavailable=peak.paused,
        peak_unavailable_at=peak.at if peak.paused else None,
        worker_seconds_paused=sum(paused),
        min_serving_fraction=min(p.serving for p in points) / n if n else None,
        min_admitted_fraction=min(p.admitted for p in points) / n if n else None,
        mean_serving_fraction=mean_serving,
        mean_admitted_fraction=mean_admitted,
        first_pause_at=first_pause,
        last_resume_at=last_resume,
        paused_seconds_min=paused[0] if paused else None,
        paused_seconds_median=statistics.median(paused) if paused else None,
        paused_seconds_max=paused[-1] if paused else None,
    )


# -- reading one refresh --------------------------------------------------------------------


def capacity_of(refresh: PolicyRefresh, *, now: dt.datetime | None = None) -> Capacity | None:
    """The capacity of `refresh` (None before it started). Three queries whatever its size:
    planned workers, the journal's pause/resume/update rows and the ledger's admitted
    intervals of its namespaces during it (both streamed as tuples)."""
    if refresh.started_at is None:
        return None
    start = refresh.started_at
    end = refresh.finished_at or now or timezone.now()
    workers = [
        Worker(*row)
        for row in PlannedWorker.objects.filter(refresh=refresh)
        .order_by("namespace", "key")
        .values_list("id", "key", "namespace")
    ]
    rows = (
        JournalEntry.objects.filter(refresh=refresh, planned_worker__isnull=False)
        .filter(Q(operation__in=(PAUSE_OPERATION, RESUME_OPERATION)) | Q(step=UPDATE_STEP))
        .order_by()
        .values_list("planned_worker_id", "step", "attempt", "operation", "ok", "finished_at")
        .iterator(chunk_size=5000)
    )
    gate_start, gate_changes = ledger_history(refresh, start, end)
    return compute(
        workers=workers,
        calls=(Call._make(row) for row in rows),
        gate_start=gate_start,
        gate_changes=gate_changes,
        namespaces=list(refresh.namespaces or []),
        target_version=refresh.weight_version,
        start=start,
        end=end,
        ongoing=refresh.finished_at is None,
    )


def ledger_history(
    refresh: PolicyRefresh, start: dt.datetime, end: dt.datetime
) -> tuple[dict[str, GateStart], list[GateChange]]:
    """Each namespace's admission from the serving ledger: admitting at `start` when some
    instance of it was admitted then (at the version most of them were admitted at), and a
    change each time that flips within [start, end]. One query, streamed.

    The ledger ends an interval and appends its successor at the same instant, so the events
    of one instant are applied together before the namespace's state is read."""
    namespaces = list(refresh.namespaces or [])
    rows = (
        ServingInterval.objects.filter(
            source_id=refresh.source_id,
            namespace__in=namespaces,
            serving=Serving.SERVING,
            valid_from__lte=end,
        )
        .exclude(admission=Admission.NOT_ADMITTED)
        .filter(Q(valid_to__isnull=True) | Q(valid_to__gt=start))
        .order_by()
        .values_list("namespace", "version", "valid_from", "valid_to")
        .iterator(chunk_size=5000)
    )
    versions: dict[str, Any] = {}
    at_start: dict[str, Counter[str]] = defaultdict(Counter)
    events: dict[str, list[tuple[dt.datetime, int, str]]] = defaultdict(list)
    for namespace, version, since, until in rows:
        key = json.dumps(version, sort_keys=True, default=str)
        versions[key] = version
        if since <= start:
            at_start[namespace][key] += 1
        else:
            events[namespace].append((since, 1, key))
        if until is not None and until <= end:
            events[namespace].append((until, -1, key))

    def state(active: Counter[str]) -> tuple[str, Any]:
        live = +active
        if not live:
            return GateState.CLOSED.value, None
        key = min(live, key=lambda k: (-live[k], k))
        return GateState.OPEN.value, versions[key]

    gate_start: dict[str, GateStart] = {}
    changes: list[GateChange] = []
    for namespace in namespaces:
        active = Counter(at_start[namespace])
        now_state, version = state(active)
        gate_start[namespace] = GateStart(now_state, version)
        ordered = sorted(events[namespace], key=lambda e: e[0])
        i = 0
        while i < len(ordered):
            at = ordered[i][0]
            while i < len(ordered) and ordered[i][0] == at:
                active[ordered[i][2]] += ordered[i][1]
                i += 1
            after, version = state(active)
            if after != now_state:
                changes.append(GateChange(namespace, at, after, version))
                now_state = after
    changes.sort(key=lambda c: c.at)
    return gate_start, changes
