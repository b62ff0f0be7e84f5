"""A refresh's pictures (see controlplane/charts.py for why server-rendered SVG).

- the phase timeline: one lane per step, one bar per attempt, from the step runs' start and
  end (a running step is drawn up to now), titled with its status and duration;
- per-worker rows under it: one lane per worker, one bar per step from the first to the last
  journaled call of that step on that worker (red when any call failed). At fleet scale the
  lanes are the `WORKER_ROWS` slowest workers by time spent in calls, with how many there are
  in all; every call of every worker stays in the journal on the same page;
- a source's refresh history: the last refreshes' durations as bars coloured by outcome,
  each a link to its page.

Each is one query, the worker rows two.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Max, Min, Q, Sum
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from controlplane import charts
from controlplane.fleet.models import Source
from controlplane.refresh.models import JournalEntry, PolicyRefresh, StepRun
from controlplane.refresh.step_order import STEP_LABELS, StepName

#: Refreshes the history chart shows.
HISTORY = 20
#: Worker lanes the per-worker timeline shows at most (the slowest ones).
WORKER_ROWS = 50
#: Room for a worker's lane label; longer keys keep their namespace and instance id.
_LABEL_CHARS = 30


def _label(name: str) -> str:
    try:
        return STEP_LABELS[StepName(name)]
    except ValueError:
        return name


def phase_timeline(refresh: PolicyRefresh) -> SafeString:
    # A step left "running" by an ended refresh is drawn up to the end, not to today.
    now = refresh.finished_at or timezone.now()
    spans = []
    for run in StepRun.objects.filter(refresh=refresh).order_by("id"):
        end = run.finished_at
        secs = ((end or now) - run.started_at).total_seconds()
        spans.append(
            charts.Span(
                _label(run.name),
                run.started_at,
                end,
                f"chart-{run.status}",
                f"{_label(run.name)} attempt {run.attempt}: {run.status} · "
                f"{charts.format_ms(secs * 1000)}",
            )
        )
    return charts.gantt(spans, label=f"Phase timeline of refresh #{refresh.pk}", now=now)


@dataclass(frozen=True, slots=True)
class WorkerTimeline:
    svg: SafeString
    #: Workers drawn, and workers with at least one journaled call.
    shown: int
    total: int
    #: The slowest worker's planned-worker id (its journal is one click away), if any.
    slowest: int | None


def _lane(key: str) -> str:
    """A worker's lane label: its namespace first and its instance id last, whatever is cut."""
    if len(key) <= _LABEL_CHARS:
        return key
    namespace, _, rest = key.partition("/")
    instance = rest.rpartition("/")[2]
    if len(namespace) + len(instance) + 3 <= _LABEL_CHARS:
        return f"{namespace}/…/{instance}"
    return charts.middle_cut(key, _LABEL_CHARS)


def worker_timeline(refresh: PolicyRefresh) -> WorkerTimeline:
    calls = JournalEntry.objects.filter(refresh=refresh, planned_worker__isnull=False)
    slowest = list(
        calls.values("planned_worker_id")
        .annotate(busy=Sum("duration_ms"))
        .order_by("-busy", "planned_worker_id")
        .values_list("planned_worker_id", flat=True)
    )
    top = slowest[:WORKER_ROWS]
    rows = (
        calls.filter(planned_worker_id__in=top)
        .values("planned_worker_id", "planned_worker__key", "step")
        .annotate(
            start=Min("started_at"),
            end=Max("finished_at"),
            n=Count("id"),
            failed=Count("id", filter=Q(ok=False)),
        )
    )
    order = {pk: i for i, pk in enumerate(top)}
    spans = []
    for row in sorted(rows, key=lambda r: (order[r["planned_worker_id"]], r["start"])):
        key, step = row["planned_worker__key"], row["step"]
        status = "failed" if row["failed"] else "ok"
        ms = (row["end"] - row["start"]).total_seconds() * 1000
        title = f"{key} · {_label(step)}: {row['n']} call(s), {status} · {charts.format_ms(ms)}"
        spans.append(charts.Span(_lane(key), row["start"], row["end"], f"chart-{status}", title))
    svg = charts.gantt(
        spans,
        label=f"Per-worker timeline of refresh #{refresh.pk} (slowest {len(top)} workers)",
        now=refresh.finished_at or timezone.now(),
        width=760,
        gutter=230,
    )
    return WorkerTimeline(svg, len(top), len(slowest), top[0] if top else None)


@dataclass(frozen=True, slots=True)
class Clock:
    """Started, ended and elapsed for the page header; elapsed runs on while active."""

    started_at: object
    finished_at: object
    elapsed_seconds: float | None


def clock(refresh: PolicyRefresh) -> Clock:
    if refresh.started_at is None:
        return Clock(None, None, None)
    end = refresh.finished_at or timezone.now()
    return Clock(
        refresh.started_at, refresh.finished_at, (end - refresh.started_at).total_seconds()
    )


def refresh_history(source: Source) -> SafeString:
    """The last refreshes of `source` that started, oldest left, bar height = duration."""
    now = timezone.now()
    rows = list(
        PolicyRefresh.objects.filter(source=source, started_at__isnull=False)
        .order_by("-started_at")
        .values_list("pk", "state", "target", "started_at", "finished_at")[:HISTORY]
    )
    marker = 987654321
    href = reverse("refresh:detail", args=[marker]).replace(str(marker), "{}")
    items = []
    for pk, state, target, started, finished in reversed(rows):
        assert started is not None  # filtered above
        version = (target or {}).get("weight_version", "?") if isinstance(target, dict) else "?"
        ms = ((finished or now) - started).total_seconds() * 1000
        title = (
            f"#{pk} {version} · {state} · {charts.format_ms(ms)}"
            f" · started {started:%Y-%m-%d %H:%M:%S} UTC"
        )
        items.append(charts.Bar(f"#{pk}", ms, f"chart-{state}", title, href.format(pk)))
    return charts.bars(items, label=f"Last {len(items)} policy refreshes and their durations")
