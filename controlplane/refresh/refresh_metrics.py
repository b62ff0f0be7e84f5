"""`/metrics` families for policy refreshes and gates, registered into fleet's endpoint.

Computed from the database at scrape time like the rest of `/metrics` (fleet/metrics.py says
why). Counters count rows: refreshes never leave the table, so `controlplane_policy_refreshes_
total` only grows; the step histogram counts finished step runs. Labels: source, namespace,
state, outcome, step — never refresh ids or worker ids.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.fleet.models import Source
from controlplane.promdb import STEP_BUCKETS, histogram
from controlplane.refresh.models import (
    ADMITTING_STATES,
    TERMINAL_STATES,
    Gate,
    GateState,
    PolicyRefresh,
    StepRun,
)


class RefreshCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        names = dict(Source.objects.values_list("pk", "name"))
        by_state = list(
            PolicyRefresh.objects.values("source_id", "state").annotate(n=Count("id")).order_by()
        )
        outcomes = CounterMetricFamily(
            "controlplane_policy_refreshes",
            "Policy refreshes that ended, by outcome (succeeded, aborted, failed, rejected, "
            "rolled_back).",
            labels=["source", "outcome"],
        )
        current = GaugeMetricFamily(
            "controlplane_policy_refreshes_in_state",
            "Policy refreshes not yet ended, by state (held ones wait for a person).",
            labels=["source", "state"],
        )
        for row in sorted(by_state, key=lambda r: (names[r["source_id"]], r["state"])):
            labels = [names[row["source_id"]], row["state"]]
            if row["state"] in TERMINAL_STATES:
                outcomes.add_metric(labels, row["n"])
            else:
                current.add_metric(labels, row["n"])
        yield outcomes
        yield current

        yield histogram(
            "controlplane_policy_refresh_step_duration_seconds",
            "Duration of finished policy refresh steps (gate, resolve, pause, update, flush, "
            "resume_engines, verify, reopen, release), by step and result.",
            StepRun.objects.filter(finished_at__isnull=False),
            label_fields=["refresh__source_id", "name", "status"],
            label_names=["source", "step", "status"],
            value_field="duration_ms",
            scale=0.001,
            buckets=STEP_BUCKETS,
            label_values=lambda r: [names[r["refresh__source_id"]], r["name"], r["status"]],
        )

        yield from gate_families(names)


def gate_families(names: dict[int, str]) -> Iterator[Metric]:
    """Each namespace's gate: its state (1 for the current one, 0 for the others, so a panel
    or an alert sees a state end instead of a series vanishing), and how long it has been
    closed (0 while it admits rollouts)."""
    state = GaugeMetricFamily(
        "controlplane_gate_state",
        "1 for the gate's current state (open, open_forced, closed, unknown), else 0.",
        labels=["source", "namespace", "state"],
    )
    closed = GaugeMetricFamily(
        "controlplane_gate_closed_seconds",
        "Seconds since the gate stopped admitting rollouts (closed or unknown); 0 while open.",
        labels=["source", "namespace"],
    )
    now = timezone.now()
    rows = Gate.objects.values_list("source_id", "namespace", "state", "since")
    for source_id, namespace, current, since in sorted(rows, key=lambda r: (names[r[0]], r[1])):
        source = names[source_id]
        for value in GateState.values:
            state.add_metric([source, namespace, value], int(value == current))
        shut = current not in ADMITTING_STATES
        closed.add_metric([source, namespace], (now - since).total_seconds() if shut else 0.0)
    yield state
    yield closed
