"""Capacity of real refreshes on the simulated fleet: the page's chart, the API's answer, a held
refresh's unresumed worker, and a query count that does not grow with the fleet."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.bulk import insert_values
from controlplane.fleet.models import Source
from controlplane.refresh import gates, ledger
from controlplane.refresh.capacity import capacity_of
from controlplane.refresh.executor.journal import JOURNAL_FIELDS
from controlplane.refresh.models import (
    Admission,
    Evidence,
    Gate,
    JournalEntry,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
)
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import fleet_config, make_source, plan, run_inline

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = 6


@pytest.fixture
def source(simfleet_factory):
    return make_source(simfleet_factory(fleet_config(WORKERS)))


def journal_times(refresh, operation: str) -> dict[str, dt.datetime]:
    """The finish time of each worker's ok call of `operation`, from the journal itself."""
    return dict(
        JournalEntry.objects.filter(refresh=refresh, operation=operation, ok=True).values_list(
            "planned_worker__key", "finished_at"
        )
    )


def test_an_all_at_once_refresh_drops_to_zero_and_returns_to_every_worker(source, operator):
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    cap = capacity_of(refresh)
    assert cap is not None and not cap.ongoing

    paused_at, resumed_at = journal_times(refresh, "pause"), journal_times(refresh, "resume")
    assert len(cap.workers) == WORKERS
    for worker in cap.workers:
        (interval,) = worker.intervals
        assert (interval.start, interval.end) == (paused_at[worker.key], resumed_at[worker.key])
        assert worker.paused_seconds > 0
        assert worker.version == "v2"
    s = cap.summary
    # Every worker is paused before any is resumed: the fleet's capacity drops to nothing.
    assert s.peak_unavailable == WORKERS and s.min_serving_fraction == 0
    assert s.min_admitted_fraction == 0
    assert s.worker_seconds_paused == pytest.approx(sum(w.paused_seconds for w in cap.workers))
    assert cap.points[0].running == {"previous": WORKERS}
    last = cap.points[-1]
    assert last.running == {"v2": WORKERS} and last.paused == 0 and last.admitted == WORKERS
    # The gates were closed from the gate step to the reopen, inside the refresh's window.
    assert {n.namespace for n in cap.namespaces} == set(refresh.namespaces)
    for gating in cap.namespaces:
        (interval,) = gating.intervals
        assert refresh.started_at <= interval.start < interval.end <= refresh.finished_at
        assert interval.start <= s.first_pause_at and interval.end >= s.last_resume_at
    # A second refresh names the version the first one verified.
    again = capacity_of(run_inline(source, operator, "v3"))
    assert again.points[0].running == {"v2": WORKERS}
    assert again.versions == ("v2", "v3")


def test_the_refresh_page_draws_the_chart_and_the_api_exports_it(source, operator, viewer_client):
    refresh = run_inline(source, operator, "v2")
    page = viewer_client.get(f"/refreshes/{refresh.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    start = html.index('<svg xmlns="http://www.w3.org/2000/svg" class="chart chart-steps"')
    svg = ET.fromstring(html[start : html.index("</svg>", start) + len("</svg>")])
    ns = {"s": "http://www.w3.org/2000/svg"}
    areas = [p.get("class") for p in svg.iterfind(".//s:path", ns)]
    # The previous version's running workers, the new version's, the paused ones, the admitted.
    assert "chart-area chart-v0" in areas and "chart-area chart-v1" in areas
    assert "chart-area chart-paused" in areas and "chart-step chart-admitted" in areas
    titles = {t.text for t in svg.iterfind(".//s:title", ns)}
    assert {"previous running", "v2 running", "paused", "admitted by the gate"} <= titles
    assert f'data-peak-unavailable="{WORKERS}"' in html
    for namespace in refresh.namespaces:
        assert f'<tr data-namespace="{namespace}">' in html

    answer = viewer_client.get(f"/api/v1/refreshes/{refresh.pk}/capacity")
    assert answer.status_code == 200
    data = answer.json()
    assert data["started"] is True and data["state"] == "succeeded"
    assert data["summary"]["peak_unavailable"] == WORKERS
    assert data["summary"]["min_serving_fraction"] == 0
    assert data["versions"] == ["previous", "v2"]
    assert data["series"][-1]["running"] == {"v2": WORKERS}
    assert data["series_exact"] is True
    workers = data["workers"]
    assert (workers["count"], workers["limit"], workers["offset"]) == (WORKERS, 50, 0)
    assert sorted(w["key"] for w in workers["items"]) == sorted(
        PlannedWorker.objects.filter(refresh=refresh).values_list("key", flat=True)
    )
    assert all(w["paused_seconds"] > 0 and len(w["intervals"]) == 1 for w in workers["items"])
    assert {n["namespace"] for n in data["namespaces"]} == set(refresh.namespaces)
    detail = viewer_client.get(f"/api/v1/refreshes/{refresh.pk}").json()
    assert detail["capacity_url"] == f"/api/v1/refreshes/{refresh.pk}/capacity"
    assert Client().get(f"/api/v1/refreshes/{refresh.pk}/capacity").status_code == 401
    assert viewer_client.get("/api/v1/refreshes/999999/capacity").status_code == 404


def test_a_planned_refresh_has_nothing_measured(source, operator, viewer_client):
    refresh = plan(source, operator, "v2")
    assert capacity_of(refresh) is None
    data = viewer_client.get(f"/api/v1/refreshes/{refresh.pk}/capacity").json()
    assert data == {
        "refresh_id": refresh.pk,
        "state": "planned",
        "started": False,
        "window": None,
        "versions": [],
        "target_version": None,
        "summary": None,
        "series": [],
        "series_exact": True,
        "namespaces": [],
        "workers": {"items": [], "count": 0, "limit": 50, "offset": 0},
    }


def test_the_workers_come_a_page_at_a_time_in_namespace_and_key_order(
    source, operator, viewer_client
):
    refresh = run_inline(source, operator, "v2")
    url = f"/api/v1/refreshes/{refresh.pk}/capacity"
    everyone = [
        key
        for _, key in sorted(
            PlannedWorker.objects.filter(refresh=refresh).values_list("namespace", "key")
        )
    ]
    pages = [viewer_client.get(url, {"limit": 4, "offset": o}).json() for o in (0, 4)]
    assert [len(p["workers"]["items"]) for p in pages] == [4, WORKERS - 4]  # the last is short
    assert all(p["workers"]["count"] == WORKERS and p["workers"]["limit"] == 4 for p in pages)
    assert [w["key"] for p in pages for w in p["workers"]["items"]] == everyone
    # The rest is whole on every page: the summary still counts every worker.
    assert all(p["summary"]["workers"] == WORKERS for p in pages)
    assert pages[0]["series"] == pages[1]["series"]

    beyond = viewer_client.get(url, {"offset": WORKERS}).json()["workers"]
    assert beyond == {"items": [], "count": WORKERS, "limit": 50, "offset": WORKERS}
    # The API's limits, as every list of it: 500 at most, at least 1.
    assert viewer_client.get(url, {"limit": 501}).status_code == 422
    assert viewer_client.get(url, {"limit": 0}).status_code == 422
    assert viewer_client.get(url, {"offset": -1}).status_code == 422


def test_a_worker_that_was_never_resumed_stays_paused_while_the_refresh_is_held(
    simfleet_factory, operator
):
    fleet = simfleet_factory(fleet_config(WORKERS))
    source = make_source(fleet)
    stuck = fleet.workers()[0]["key"]
    for route in ("resume_generation", "continue_generation"):  # vLLM's, SGLang's
        fleet.inject(stuck, route, Fault.http(503, "engine wedged"))
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.HELD, refresh.state

    later = timezone.now() + dt.timedelta(seconds=30)
    cap = capacity_of(refresh, now=later)
    assert cap.ongoing and cap.end == later
    (stuck_worker,) = [w for w in cap.workers if w.paused_at_end]
    failed = JournalEntry.objects.filter(refresh=refresh, operation="resume", ok=False)
    assert set(failed.values_list("planned_worker__key", flat=True)) == {stuck_worker.key}
    assert stuck_worker.intervals[-1].end is None
    # Paused until "now": the 30 s after the hold count too.
    assert stuck_worker.paused_seconds >= 30
    assert cap.summary.paused_at_end == 1
    assert cap.points[-1].paused == 1 and cap.points[-1].running == {"v2": WORKERS - 1}
    # The gates stay closed while held: nothing is admitted, and they are gated to the end.
    assert cap.points[-1].admitted == 0
    assert all(n.gated_at_end for n in cap.namespaces)


def _synthetic_refresh(source: Source, workers: int) -> PolicyRefresh:
    """A finished refresh with `workers` planned workers and a pause, an update and a resume
    call each in the journal (written like the executor writes them)."""
    t0 = timezone.now() - dt.timedelta(minutes=5)
    refresh = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a", "rl-b"],
        target={"weight_version": "v9", "method": "disk", "model_path": "/m"},
        state=RefreshState.SUCCEEDED,
        started_at=t0,
        finished_at=t0 + dt.timedelta(seconds=60),
    )
    PlannedWorker.objects.bulk_create(
        PlannedWorker(
            refresh=refresh,
            key=f"rl-{'ab'[i % 2]}/backend/generate/{i}",
            namespace=f"rl-{'ab'[i % 2]}",
            instance_id=str(i),
        )
        for i in range(workers)
    )
    rows = []
    for i, pk in enumerate(
        PlannedWorker.objects.filter(refresh=refresh).values_list("pk", flat=True)
    ):
        for step, operation, at in (
            ("pause", "pause", 1 + i / workers),
            ("update", "update_from_disk", 10),
            ("resume_engines", "resume", 20 + i / workers),
        ):
            when = t0 + dt.timedelta(seconds=at)
            call = (step, operation, "POST", "http://w/", None, 200, None, True, "", 5.0, 1)
            rows.append((refresh.pk, pk, *call, when, when, 1, False, None))
    insert_values(JournalEntry, JOURNAL_FIELDS, rows)
    return refresh


def test_the_query_count_does_not_grow_with_the_fleet():
    source = Source.objects.create(
        name="synthetic", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    counts = {}
    for workers in (10, 2000):
        refresh = _synthetic_refresh(source, workers)
        with CaptureQueriesContext(connection) as queries:
            cap = capacity_of(refresh)
        counts[workers] = len(queries.captured_queries)
        assert cap.summary.workers == workers and cap.summary.peak_unavailable == workers
        assert cap.points[-1].running == {"v9": workers}
    assert counts[2000] == counts[10] <= 4, counts


def test_a_gate_closed_before_the_refresh_counts_as_gated_from_its_start():
    source = Source.objects.create(
        name="drifted", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    closed = Gate.objects.create(source=source, namespace="rl-a", verified_version="v1")
    Gate.objects.create(source=source, namespace="rl-b", verified_version="v1")
    # Both admitted at v1 in the serving ledger (what a verifying refresh leaves there).
    admitted = {
        "version": "v1",
        "admission": Admission.VERIFIED,
        "evidence": Evidence.VERIFIED_REFRESH,
    }
    ledger.write(
        source, {(ns, f"{i}"): admitted for i, ns in enumerate(["rl-a", "rl-b"])}, cause="t"
    )
    gates.close_for_drift(closed.pk, actor=Actor.system("test"), reason="a worker drifted")
    started = timezone.now()
    refresh = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a", "rl-b", "rl-c"],
        target={"weight_version": "v2", "method": "disk", "model_path": "/m"},
        state=RefreshState.HELD,
        started_at=started,
    )
    cap = capacity_of(refresh, now=started + dt.timedelta(seconds=10))
    # Never verified (no admission in the ledger): it admitted nothing, so it counts as gated
    # for the whole window, though no gate change was ever audited for it.
    assert [
        (iv.start, iv.end) for iv in {n.namespace: n for n in cap.namespaces}["rl-c"].intervals
    ] == [(started, None)]
    gating = {n.namespace: n for n in cap.namespaces}
    # Closed by drift before the refresh: gated from the refresh's start, not from the closing.
    assert [(iv.start, iv.end) for iv in gating["rl-a"].intervals] == [(started, None)]
    assert gating["rl-a"].gated_seconds == pytest.approx(10.0)
    assert gating["rl-b"].intervals == ()
