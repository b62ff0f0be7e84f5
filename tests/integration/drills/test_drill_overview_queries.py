"""The rollback-drill status on the fleet overview reads every source's drills in a fixed
number of queries: three sources cost what one costs, and each card still says its own."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.fleet.models import Source
from controlplane.refresh.models import DrillOutcome, DrillRun

pytestmark = pytest.mark.django_db

POLICY = {"method": "disk", "weight_version": "v2"}


def source_with_drills(name: str) -> Source:
    """A source with a proven drill, a later failed one and one running."""
    source = Source.objects.create(name=name, listener_url=f"http://127.0.0.1:1/{name}")
    now = timezone.now()
    for minutes, outcome, reason in (
        (30, DrillOutcome.SUCCEEDED, ""),
        (20, DrillOutcome.FAILED, f"{name}: the back refresh held"),
        (1, DrillOutcome.RUNNING, ""),
    ):
        DrillRun.objects.create(
            source=source,
            current_policy=POLICY,
            previous_policy={**POLICY, "weight_version": "v1"},
            outcome=outcome,
            reason=reason,
            forward_seconds=4.0,
            back_seconds=5.0,
            started_at=now - timedelta(minutes=minutes),
            finished_at=None if outcome == DrillOutcome.RUNNING else now,
        )
    return source


def drill_queries(client) -> tuple[int, int, str]:
    """(queries reading drills, all queries, page) of one overview request."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/")
    assert response.status_code == 200
    sql = [q["sql"] for q in captured.captured_queries]
    return sum(1 for s in sql if "refresh_drillrun" in s), len(sql), response.content.decode()


def test_the_overview_reads_drills_in_the_same_queries_for_one_or_three_sources(viewer_client):
    source_with_drills("alpha")
    one_drill, _, page = drill_queries(viewer_client)
    assert "last drill failed" in page and "alpha: the back refresh held" in page

    source_with_drills("beta")
    source_with_drills("gamma")
    three_drill, _, page = drill_queries(viewer_client)

    assert one_drill == three_drill == 2
    for name in ("alpha", "beta", "gamma"):
        assert f"{name}: the back refresh held" in page
    running = DrillRun.objects.filter(outcome=DrillOutcome.RUNNING)
    assert all(f"drill #{d.pk} forward" in page for d in running)


def test_a_proven_drill_is_shown_per_source_after_a_failed_one_elsewhere(viewer_client):
    failed = source_with_drills("alpha")
    proven = Source.objects.create(name="beta", listener_url="http://127.0.0.1:1/beta")
    DrillRun.objects.create(
        source=proven,
        current_policy=POLICY,
        previous_policy=POLICY,
        outcome=DrillOutcome.SUCCEEDED,
        forward_seconds=41.2,
        back_seconds=39.8,
        finished_at=timezone.now(),
    )
    _, _, page = drill_queries(viewer_client)
    assert f'id="drill-status-{failed.pk}"' in page
    beta = page.split(f'id="drill-status-{proven.pk}"', 1)[1].split("</span>\n", 1)[0]
    assert "rollback last proven" in beta and "forward 41.2 s, back 39.8 s" in beta
    assert "last drill failed" not in beta
