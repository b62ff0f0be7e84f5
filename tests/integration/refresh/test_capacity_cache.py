"""The refresh page's capacity section is computed once and shared: a finished refresh's for
good, a running one's per journal high-water mark (real Redis cache)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.refresh import capacity_chart
from controlplane.refresh.models import JournalEntry, PolicyRefresh, RefreshState
from tests.integration.refresh.helpers import fleet_config, make_source, run_inline

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def finished(fleet, operator):
    refresh = run_inline(make_source(fleet), operator, "v2")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    return refresh


def queries_of(fn):
    with CaptureQueriesContext(connection) as captured:
        value = fn()
    return value, len(captured.captured_queries)


def test_a_finished_refresh_is_computed_once_for_every_viewer(finished):
    first, computed = queries_of(lambda: capacity_chart.view(finished))
    assert computed >= 3  # the three capacity queries
    viewer = PolicyRefresh.objects.get(pk=finished.pk)  # another viewer's request
    again, cached = queries_of(lambda: capacity_chart.view(viewer))
    assert cached == 0
    assert again.chart == first.chart
    assert again.cap.summary == first.cap.summary


def test_a_live_refresh_is_shared_until_its_journal_moves(finished, settings):
    settings.CAPACITY_LIVE_CACHE_SECONDS = 60
    # The same refresh seen as if it were still running (held: its intervals run to now).
    live = PolicyRefresh.objects.get(pk=finished.pk)
    PolicyRefresh.objects.filter(pk=live.pk).update(state=RefreshState.HELD, finished_at=None)
    live.refresh_from_db()

    first, computed = queries_of(lambda: capacity_chart.view(live))
    second, shared = queries_of(lambda: capacity_chart.view(live))
    assert shared == 1  # only the journal's high-water mark
    assert second.chart == first.chart

    # A new journal row (a worker paused again) is a new computation that shows it.
    pause = JournalEntry.objects.filter(refresh=live, operation="pause", ok=True).first()
    assert first.cap.summary.peak_unavailable >= 1
    now = timezone.now()
    pause.pk = None
    pause.attempt = 9
    pause.started_at = pause.finished_at = now
    pause.save()
    third, recomputed = queries_of(lambda: capacity_chart.view(live))
    assert recomputed == computed
    assert third.cap.summary.paused_at_end == 1
    assert [w.key for w in third.longest if w.paused_at_end] == [pause.planned_worker.key]


def test_without_live_sharing_every_viewer_computes(finished, settings):
    settings.CAPACITY_LIVE_CACHE_SECONDS = 0
    PolicyRefresh.objects.filter(pk=finished.pk).update(state=RefreshState.HELD, finished_at=None)
    live = PolicyRefresh.objects.get(pk=finished.pk)
    _, first = queries_of(lambda: capacity_chart.view(live))
    _, second = queries_of(lambda: capacity_chart.view(live))
    assert first == second >= 4
