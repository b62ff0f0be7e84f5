"""`/metrics` gauges for policy lag, registered into fleet's endpoint by refresh.

Labels stay low-cardinality: source and namespace names — never versions, steps or lineages
(those are values, and the gate API names them).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.fleet.models import PublishedPolicy
from controlplane.refresh.gate_lags import lags_by_gate
from controlplane.refresh.models import Gate


class LagCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["source", "namespace"]
        steps = GaugeMetricFamily(
            "controlplane_policy_lag_steps",
            "Training steps between the trainer's latest published policy and the oldest "
            "version the namespace's gate admits (absent when unknown).",
            labels=labels,
        )
        seconds = GaugeMetricFamily(
            "controlplane_policy_lag_seconds",
            "Seconds between the publication of the latest policy and of the oldest admitted "
            "one (absent when unknown).",
            labels=labels,
        )
        exceeded = GaugeMetricFamily(
            "controlplane_policy_lag_exceeded",
            "1 while the namespace serves a policy more steps behind than its source allows.",
            labels=labels,
        )
        # Only sources that ever published have a lag: one read finds them, so gates of the
        # others cost nothing; a publishing source's gates cost three reads together.
        publishing = set(PublishedPolicy.objects.values_list("source_id", flat=True).distinct())
        gates = list(
            Gate.objects.filter(source_id__in=publishing)
            .select_related("source")
            .order_by("source__name", "namespace")
        )
        lags = lags_by_gate(gates)
        for gate in gates:
            lag = lags[gate.pk]
            if lag is None:
                continue
            names = [gate.source.name, gate.namespace]
            if lag.steps is not None:
                steps.add_metric(names, lag.steps)
            if lag.seconds is not None:
                seconds.add_metric(names, lag.seconds)
            exceeded.add_metric(names, 1 if lag.exceeded else 0)
        yield steps
        yield seconds
        yield exceeded
