"""The fleet overview costs the same number of queries for one source as for five: worker
counts, versions, gate and refresh badges, drift, quarantines and drills are read for every
listed source at once, and each card still shows its own."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.fleet.live import overview_html
from controlplane.fleet.models import Source, Worker, WorkerState
from controlplane.refresh.models import (
    DrillOutcome,
    DrillRun,
    Gate,
    GateState,
    PolicyRefresh,
    Quarantine,
    QuarantineState,
    RefreshState,
)

pytestmark = pytest.mark.django_db


def busy_source(n: int) -> Source:
    """A source with something in every badge: live, erroring and gone workers at two versions,
    an open and a closed gate (with drift), an active refresh, a quarantine and a drill."""
    name = f"src-{n}"
    source = Source.objects.create(name=name, listener_url=f"http://127.0.0.1:1/{name}")
    now = timezone.now()
    for i, (state, version) in enumerate(
        [
            (WorkerState.LIVE, f"v{n}"),
            (WorkerState.LIVE, f"v{n}"),
            (WorkerState.ERRORING, f"old{n}"),
            (WorkerState.GONE, "gone"),
        ]
    ):
        Worker.objects.create(
            source=source,
            namespace=f"ns-{n}",
            component="backend",
            endpoint="generate",
            instance_id=str(1000 * n + i),
            state=state,
            weight_version=version,
            first_seen_at=now,
            last_seen_at=now,
        )
    Gate.objects.create(
        source=source,
        namespace=f"ns-{n}",
        state=GateState.OPEN,
        verified_version=f"v{n}",
        verified_policy={"weight_version": f"v{n}"},
        verified_instances=[str(1000 * n)],
        drift=[
            {"key": f"{name}-w{i}", "kind": "version", "state": "drifting", "instance_id": str(i)}
            for i in range(n)
        ],
    )
    refresh = PolicyRefresh.objects.create(
        source=source,
        namespaces=[f"held-{n}"],
        target={"weight_version": f"next{n}"},
        state=RefreshState.HELD,
        held_reason="update failed",
    )
    Gate.objects.create(
        source=source,
        namespace=f"held-{n}",
        state=GateState.CLOSED,
        reason=f"held by {name}",
        active_refresh=refresh,
    )
    for i in range(n):
        Quarantine.objects.create(
            source=source,
            namespace=f"ns-{n}",
            instance_id=str(1000 * n + i),
            key=f"{name}-q{i}",
            kind="version",
            state=QuarantineState.QUARANTINED,
        )
    DrillRun.objects.create(
        source=source,
        current_policy={"weight_version": f"v{n}"},
        previous_policy={"weight_version": "v0"},
        outcome=DrillOutcome.FAILED,
        reason=f"{name}: the back refresh held",
        finished_at=now,
    )
    return source


def overview(client) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/")
    assert response.status_code == 200
    return len(captured.captured_queries), response.content.decode()


def card(page: str, source: Source) -> str:
    return page.split(f'id="source-card-{source.pk}"', 1)[1].split("</section>", 1)[0]


def test_the_overview_costs_the_same_for_one_source_as_for_five(viewer_client):
    first = busy_source(1)
    one, page = overview(viewer_client)
    assert "2 live" in card(page, first)

    sources = [first, *(busy_source(n) for n in range(2, 6))]
    five, page = overview(viewer_client)

    assert one == five
    for n, source in enumerate(sources, start=1):
        shown = card(page, source)
        assert "2 live" in shown and "1 erroring" in shown and "1 gone" in shown
        assert f"v{n}</code> \u00d7 2" in shown and f"old{n}</code> \u00d7 1" in shown
        assert f"ns-{n} open" in shown and f"held-{n} closed" in shown
        assert f"held by src-{n}" in shown
        refresh = PolicyRefresh.objects.get(source=source)
        assert f"refresh #{refresh.pk} held" in shown
        assert f"{n} drifted" in shown and f"{n} quarantined" in shown
        assert f"src-{n}: the back refresh held" in shown
        for other in sources:
            if other != source:
                assert f"{other.name}-w0:" not in shown


def test_the_live_overview_push_costs_the_same_for_one_source_as_for_five():
    busy_source(1)
    with CaptureQueriesContext(connection) as one:
        overview_html()
    for n in range(2, 6):
        busy_source(n)
    with CaptureQueriesContext(connection) as five:
        html = overview_html()
    assert len(one.captured_queries) == len(five.captured_queries)
    assert all(f"src-{n}: the back refresh held" in html for n in range(1, 6))
