"""The refresh page's timing: the estimated end (per-step medians of the source's successful
refreshes), "closed since" per namespace, and per-worker rows in the phase timeline, capped to
the slowest workers at fleet scale."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.utils import timezone

from controlplane.fleet.models import Source
from controlplane.refresh import charts, eta
from controlplane.refresh.models import (
    Gate,
    GateState,
    JournalEntry,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
    StepRun,
)

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )


def refresh_with_steps(source, state, steps: dict[str, float], start=T0) -> PolicyRefresh:
    """A refresh whose steps `name → seconds` ran one after the other from `start`."""
    refresh = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a"],
        target={"weight_version": "v1"},
        state=state,
        started_at=start,
    )
    at = start
    for name, secs in steps.items():
        end = at + dt.timedelta(seconds=secs)
        StepRun.objects.create(
            refresh=refresh,
            name=name,
            status="ok",
            started_at=at,
            finished_at=end,
            duration_ms=secs * 1000,
        )
        at = end
    return refresh


FULL = {"gate": 1, "resolve": 2, "pause": 3, "update": 60, "flush": 4}
FULL |= {"resume_engines": 5, "verify": 20, "reopen": 2}


def test_the_estimate_adds_per_step_medians_of_past_successes_minus_time_spent(source):
    for update in (50, 60, 400):  # the median, not the mean: one slow update does not count
        refresh_with_steps(source, RefreshState.SUCCEEDED, FULL | {"update": update})
    refresh_with_steps(source, RefreshState.FAILED, FULL | {"update": 9999})  # not a success
    running = refresh_with_steps(
        source, RefreshState.UPDATING, {"gate": 1, "resolve": 2, "pause": 3}
    )
    StepRun.objects.create(
        refresh=running, name="update", status="running", started_at=T0 + dt.timedelta(seconds=6)
    )
    now = T0 + dt.timedelta(seconds=6 + 15)  # 15 s into the update
    found = eta.estimate(running, now=now)
    assert found is not None and found.basis == 3
    # update 60 - 15 left, then flush 4 + resume 5 + verify 20 + reopen 2.
    assert found.remaining_seconds == pytest.approx(45 + 4 + 5 + 20 + 2)
    assert found.finish_at == now + dt.timedelta(seconds=76)

    # An update that overran its median counts as done-any-moment, never negative.
    late = eta.estimate(running, now=T0 + dt.timedelta(seconds=600))
    assert late is not None and late.remaining_seconds == pytest.approx(4 + 5 + 20 + 2)


def test_no_estimate_without_history_or_once_the_refresh_stopped(source):
    running = refresh_with_steps(source, RefreshState.UPDATING, {"gate": 1})
    assert eta.estimate(running) is None
    refresh_with_steps(source, RefreshState.SUCCEEDED, FULL)
    assert eta.estimate(running) is not None
    held = refresh_with_steps(source, RefreshState.HELD, {"gate": 1})
    assert eta.estimate(held) is None


def test_the_refresh_page_shows_the_estimate_and_how_long_each_gate_has_been_closed(
    source, viewer_client
):
    refresh_with_steps(source, RefreshState.SUCCEEDED, FULL)
    running = refresh_with_steps(source, RefreshState.UPDATING, {"gate": 1}, start=timezone.now())
    closed_at = timezone.now() - dt.timedelta(minutes=7)
    Gate.objects.create(
        source=source,
        namespace="rl-a",
        state=GateState.CLOSED,
        since=closed_at,
        reason="refreshing",
        active_refresh=running,
    )
    page = viewer_client.get(f"/refreshes/{running.pk}/").content.decode()
    assert re.search(r'<dd id="refresh-eta"><time datetime="[^"]+"', page)
    assert "per-step medians of the last 1 successful refresh of this source" in page
    since = re.search(r'<small class="gate-since">closed since (.*?)</small>', page, re.S)
    assert since is not None
    assert closed_at.astimezone(dt.UTC).strftime("%H:%M:%S") in since.group(1)
    assert "(7\xa0minutes)" in since.group(1)


def _journal(refresh, workers: int, *, failed_key: str | None = None) -> list[PlannedWorker]:
    planned = PlannedWorker.objects.bulk_create(
        PlannedWorker(
            refresh=refresh, key=f"rl-a/backend/generate/{i}", namespace="rl-a", instance_id=str(i)
        )
        for i in range(workers)
    )
    rows = []
    for i, pw in enumerate(planned):
        at = T0
        for step, secs in (("pause", 1.0), ("update", 10.0 + i)):
            end = at + dt.timedelta(seconds=secs)
            rows.append(
                JournalEntry(
                    refresh=refresh,
                    planned_worker=pw,
                    step=step,
                    operation=step,
                    method="POST",
                    url="http://w/engine/x",
                    ok=not (pw.key == failed_key and step == "update"),
                    duration_ms=secs * 1000,
                    started_at=at,
                    finished_at=end,
                    lease_token=1,
                )
            )
            at = end
    JournalEntry.objects.bulk_create(rows)
    return planned


def test_worker_rows_draw_one_lane_per_worker_with_a_bar_per_step(source):
    refresh = refresh_with_steps(source, RefreshState.SUCCEEDED, FULL)
    workers = _journal(refresh, 3, failed_key="rl-a/backend/generate/1")
    chart = charts.worker_timeline(refresh)
    assert (chart.shown, chart.total) == (3, 3)
    assert chart.slowest == workers[2].pk  # the longest update
    svg = str(chart.svg)
    assert svg.count('class="chart-label"') == 3
    assert svg.count("<rect") == 6
    assert svg.count("chart-span chart-failed") == 1
    assert "rl-a/backend/generate/1 · Update weights: 1 call(s), failed" in svg


def test_at_fleet_scale_only_the_slowest_workers_get_a_lane(source, viewer_client):
    refresh = refresh_with_steps(source, RefreshState.SUCCEEDED, FULL)
    workers = _journal(refresh, charts.WORKER_ROWS + 30)
    chart = charts.worker_timeline(refresh)
    assert (chart.shown, chart.total) == (charts.WORKER_ROWS, charts.WORKER_ROWS + 30)
    svg = str(chart.svg)
    assert svg.count('class="chart-label"') == charts.WORKER_ROWS
    # The fastest 30 (the shortest updates) are left out; the slowest is drawn first.
    assert f"generate/{workers[0].instance_id} ·" not in svg
    assert svg.index(f"generate/{workers[-1].instance_id} ·") < svg.index(
        f"generate/{workers[-2].instance_id} ·"
    )
    page = viewer_client.get(f"/refreshes/{refresh.pk}/").content.decode()
    assert f"the slowest {charts.WORKER_ROWS} of {charts.WORKER_ROWS + 30} by time in calls" in page
    journal = f'href="/refreshes/{refresh.pk}/?j_worker={workers[-1].pk}#refresh-journal"'
    assert journal in page
    # A pushed head fetches the rows (too heavy to push); the fragment is the same.
    fragment = viewer_client.get(f"/refreshes/{refresh.pk}/worker-timeline/").content.decode()
    assert fragment.startswith('<div id="worker-timeline-slot">') and journal in fragment
    assert fragment.count('class="chart-label"') == charts.WORKER_ROWS
