"""`/metrics` parses as Prometheus text, has the refresh, gate, drift, webhook, notification and
discovery families, and its figures move when a policy refresh runs. The Grafana dashboard in
deploy/grafana/ only charts families that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from controlplane.notify.models import NotificationDestination
from controlplane.refresh.models import RefreshState
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import fleet_config, make_source, run_inline, sync_workers

pytestmark = pytest.mark.django_db

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "controlplane.json"
NEW_FAMILIES = {
    "controlplane_policy_refreshes": "counter",
    "controlplane_policy_refreshes_in_state": "gauge",
    "controlplane_policy_refresh_step_duration_seconds": "histogram",
    "controlplane_gate_state": "gauge",
    "controlplane_gate_closed_seconds": "gauge",
    "controlplane_audit_events": "counter",
    "controlplane_webhook_deliveries": "gauge",
    "controlplane_notification_deliveries": "gauge",
    "controlplane_notification_attempts": "counter",
    "controlplane_discovery_duration_seconds": "gauge",
}


def scrape(client, queries: list[int] | None = None) -> dict:
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/metrics")
    if queries is not None:
        queries.append(len(captured))
    assert response.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def value(families, sample_name: str, **labels) -> float:
    family_name = re.sub(r"_(total|bucket|sum|count)$", "", sample_name)
    family = families.get(family_name) or families[sample_name]
    found = [
        s.value
        for s in family.samples
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(found)


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(4))


def test_metrics_parse_and_move_with_a_refresh(fleet, operator, client):
    source = make_source(fleet)
    NotificationDestination.objects.create(
        name="ops", kind="webhook", url="http://127.0.0.1:9/hook", allowed_networks=[]
    )
    sync_workers(source)
    queries: list[int] = []
    before = scrape(client, queries)
    for name, kind in NEW_FAMILIES.items():
        assert before[name].type == kind, name
    assert value(before, "controlplane_policy_refreshes_total", outcome="succeeded") == 0

    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    after = scrape(client, queries)
    # Aggregates only: more refreshes, gates and runs do not mean more queries.
    assert queries[0] == queries[1], queries

    assert (
        value(after, "controlplane_policy_refreshes_total", source="sim", outcome="succeeded") == 1
    )
    step = "controlplane_policy_refresh_step_duration_seconds_count"
    for phase in ("pause", "update", "flush", "resume_engines", "verify", "reopen"):
        assert value(before, step, step=phase) == 0
        assert value(after, step, source="sim", step=phase, status="ok") == 1, phase
    inf = value(after, "controlplane_policy_refresh_step_duration_seconds_bucket", step="update")
    assert inf >= 1  # cumulative buckets: at least the +Inf one counts the run
    for namespace in refresh.namespaces:
        assert value(after, "controlplane_gate_state", namespace=namespace, state="open") == 1
        assert value(after, "controlplane_gate_state", namespace=namespace, state="closed") == 0
        assert value(after, "controlplane_gate_closed_seconds", namespace=namespace) == 0
    started = "controlplane_audit_events_total"
    assert value(after, started, action="policy_refresh.started") == 1 + value(
        before, started, action="policy_refresh.started"
    )
    # The success notification is queued for the destination.
    assert value(after, "controlplane_notification_deliveries", destination="ops") >= 1
    assert value(before, "controlplane_notification_deliveries", destination="ops") == 0
    # Planning ran a discovery refresh: its latency is there, by quantile.
    assert value(after, "controlplane_discovery_duration_seconds", source="sim", quantile="0.5") > 0
    # Never instance ids as labels.
    for family in after.values():
        for sample in family.samples:
            assert not set(sample.labels) & {"instance_id", "worker", "key", "refresh"}


def test_a_held_refresh_shows_a_closed_gate_and_its_time_closed(fleet, operator, client):
    source = make_source(fleet)
    bad = fleet.workers()[0]
    fleet.inject(bad["key"], "update_weights_from_disk", Fault.error("disk full"))
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.HELD
    families = scrape(client)
    assert value(families, "controlplane_policy_refreshes_in_state", state="held") == 1
    assert value(families, "controlplane_policy_refreshes_total") == 0
    assert value(families, "controlplane_gate_state", state="closed") == len(refresh.namespaces)
    closed = [
        s.value
        for s in families["controlplane_gate_closed_seconds"].samples
        if s.labels["source"] == "sim"
    ]
    assert closed and all(v > 0 for v in closed)
    failed = "controlplane_policy_refresh_step_duration_seconds_count"
    assert value(families, failed, step="update", status="failed") == 1


def test_grafana_dashboard_charts_only_families_that_exist(fleet, operator, client):
    dashboard = json.loads(DASHBOARD.read_text())
    families = scrape(client)
    exposed = set()
    for name, family in families.items():
        exposed.add(name)
        exposed.update(s.name for s in family.samples)
        if family.type == "counter":
            exposed.add(f"{name}_total")
        if family.type == "histogram":
            exposed.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 15
    used = {name for expr in exprs for name in re.findall(r"\bcontrolplane_[a-z_]+", expr)}
    assert used and used <= exposed, used - exposed
    # Every family this work added is charted somewhere.
    charted = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in used}
    assert set(NEW_FAMILIES) <= charted | {"controlplane_policy_refreshes"}, (
        set(NEW_FAMILIES) - charted
    )
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
