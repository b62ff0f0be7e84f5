"""A worker runtime's own per-endpoint metrics, served on its system server's `/metrics`.

The names and labels are those a 1.6.1 worker exposes for its `generate` endpoint (observed:
`dynamo_component_*` with `dynamo_component`, `dynamo_endpoint`, `dynamo_namespace` and
`worker_id`, the instance id in lower-case hex). They are the only per-worker request and
error counters in a 1.6.1 deployment: the frontend counts per model.
"""

from __future__ import annotations

from controlplane.simfleet.promtext import MetricsRegistry

REQUESTS = "dynamo_component_requests_total"
ERRORS = "dynamo_component_errors_total"
INFLIGHT = "dynamo_component_inflight_requests"
DURATION = "dynamo_component_request_duration_seconds"
#: The worker histogram's bounds, as observed on 1.6.1.
DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120,
                    300, 600]  # fmt: skip
LABELS = ("dynamo_component", "dynamo_endpoint", "dynamo_namespace", "worker_id")
#: The work handler's error type for a failed generation.
GENERATE_ERROR = "generate"


class EndpointMetrics:
    """Requests, errors, inflight and durations of one worker's `generate` endpoint."""

    def __init__(self, namespace: str, component: str, instance_id: int) -> None:
        self.labels = {
            "dynamo_component": component,
            "dynamo_endpoint": "generate",
            "dynamo_namespace": namespace,
            "worker_id": f"{instance_id:x}",
        }
        r = self.registry = MetricsRegistry()
        r.counter(REQUESTS, "Total number of requests processed by work handler", LABELS)
        r.counter(
            ERRORS, "Total number of errors in work handler processing", (*LABELS, "error_type")
        )
        r.gauge(INFLIGHT, "Number of requests currently being processed by work handler", LABELS)
        r.histogram(
            DURATION, "Time spent processing requests by work handler", LABELS, DURATION_BUCKETS
        )
        self.inflight = 0

    def started(self) -> None:
        self.registry.inc_labelled(REQUESTS, self.labels)
        self.inflight += 1
        self.registry.set(INFLIGHT, float(self.inflight), **self.labels)

    def finished(self, seconds: float, *, failed: bool) -> None:
        self.inflight -= 1
        self.registry.set(INFLIGHT, float(self.inflight), **self.labels)
        self.registry.observe(DURATION, seconds, **self.labels)
        if failed:
            self.registry.inc_labelled(ERRORS, self.labels | {"error_type": GENERATE_ERROR})

    def render(self) -> str:
        return self.registry.render()
