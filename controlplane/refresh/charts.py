"""A refresh's pictures (see controlplane/charts.py for why server-rendered SVG).

- the phase timeline: one lane per step, one bar per attempt, from the step runs' start and
  end (a running step is drawn up to now), titled with its status and duration;
- a source's refresh history: the last refreshes' durations as bars coloured by outcome,
  each a link to its page.

Each is one query.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from controlplane import charts
from controlplane.fleet.models import Source
from controlplane.refresh.models import PolicyRefresh, StepRun
from controlplane.refresh.sequence import STEP_LABELS, StepName

#: Refreshes the history chart shows.
HISTORY = 20


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
