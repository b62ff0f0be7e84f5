"""The simulated frontend's Prometheus `/metrics`: the Dynamo 1.6.1 frontend's names and labels.

Names come from `dynamo.prometheus_names.frontend_service` in the 1.6.1 wheel (prefix
`dynamo_frontend_`); label sets and histogram buckets from the frontend's `Metrics::new`
(lib/llm/src/http/service/metrics.rs): log-spaced buckets rounded to two significant figures,
starting at 0. Only series that saw traffic are exposed, as the Rust `prometheus` crate does for
labelled vectors. Rendered in the text exposition format, without `_created` samples (the Rust
client has none).

The series are counted from the simulated traffic itself, errors included, per model; the
per-worker gauges (`worker_last_*`) carry `worker_id`, `dp_rank` and `worker_type` as the real
frontend's do.
"""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.simfleet.promtext import MetricsRegistry, log_buckets

PREFIX = "dynamo_frontend"
ENDPOINT_COMPLETIONS = "completions"
#: Aggregated workers serve both phases; the real frontend labels their timings `decode`.
WORKER_TYPE = "decode"
#: The label value the frontend uses when a worker reports no data-parallel rank.
UNSET_DP_RANK = "none"

#: `failures_total`'s (class, reason) for the error types whose labels were observed on the
#: real 1.6.1 frontend; engine failures are not counted there until observed.
FAILURE_LABELS = {
    "validation": ("InvalidRequest", "request.invalid"),
    "not_found": ("NotFound", "request.not_found"),
}


def n(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


class FrontendMetrics:
    """The frontend's request accounting, named as Dynamo 1.6.1 names it."""

    REQUESTS = n("requests_total")
    FAILURES = n("failures_total")
    STARTED = n("requests_started_total")
    INFLIGHT = n("inflight_requests")
    QUEUED = n("queued_requests")
    DISCONNECTED = n("disconnected_clients")
    DURATION = n("request_duration_seconds")
    INPUT = n("input_sequence_tokens")
    OUTPUT = n("output_sequence_tokens")
    OUTPUT_TOKENS = n("output_tokens_total")
    TTFT = n("time_to_first_token_seconds")
    ITL = n("inter_token_latency_seconds")
    MODEL_READY = n("model_ready")
    WORKER_TTFT = n("worker_last_time_to_first_token_seconds")
    WORKER_ISL = n("worker_last_input_sequence_tokens")
    WORKER_ITL = n("worker_last_inter_token_latency_seconds")

    def __init__(self) -> None:
        r = self.registry = MetricsRegistry()
        model = ("model",)
        worker = ("worker_id", "dp_rank", "worker_type")
        r.counter(
            self.REQUESTS,
            "Total number of LLM requests processed",
            ("model", "endpoint", "request_type", "status", "error_type"),
        )
        r.counter(
            self.FAILURES, "Total number of terminal semantic request failures", ("class", "reason")
        )
        r.counter(
            self.STARTED,
            "Total number of LLM requests accepted by the frontend handler",
            ("model", "endpoint", "request_type"),
        )
        r.gauge(self.INFLIGHT, "Number of inflight requests", model)
        r.gauge(self.QUEUED, "Number of requests in HTTP processing queue", model)
        r.gauge(self.DISCONNECTED, "Number of disconnected clients", ())
        r.histogram(self.DURATION, "Duration of LLM requests", model, log_buckets(1.0, 512.0, 10))
        r.histogram(
            self.INPUT, "Input sequence length in tokens", model, log_buckets(50.0, 128000.0, 12)
        )
        r.histogram(
            self.OUTPUT, "Output sequence length in tokens", model, log_buckets(50.0, 32000.0, 10)
        )
        r.counter(
            self.OUTPUT_TOKENS,
            "Total number of output tokens generated (updates in real-time)",
            model,
        )
        r.histogram(
            self.TTFT, "Time to first token in seconds", model, log_buckets(0.001, 480.0, 18)
        )
        r.histogram(self.ITL, "Inter-token latency in seconds", model, log_buckets(0.001, 2.0, 13))
        r.gauge(
            self.MODEL_READY,
            "Whether the frontend can route at least one inference request for the model"
            " (1 = ready, 0 = not ready)",
            model,
        )
        r.gauge(self.WORKER_TTFT, "Last observed time to first token per worker (seconds)", worker)
        r.gauge(self.WORKER_ISL, "Last observed input sequence tokens per worker", worker)
        r.gauge(self.WORKER_ITL, "Last observed inter-token latency per worker (seconds)", worker)

    # -- one request's life ---------------------------------------------------------------------
    def started(self, model: str, request_type: str) -> None:
        self.registry.inc(
            self.STARTED, model=model, endpoint=ENDPOINT_COMPLETIONS, request_type=request_type
        )
        self._shift(self.INFLIGHT, model, +1)
        self._shift(self.QUEUED, model, +1)

    def first_token(self, model: str, worker_id: int, seconds: float, input_tokens: int) -> None:
        """The first token left the engine: the request is no longer queued."""
        self._shift(self.QUEUED, model, -1)
        self.registry.observe(self.TTFT, seconds, model=model)
        self.registry.observe(self.INPUT, float(input_tokens), model=model)
        labels = self._worker(worker_id)
        self.registry.set(self.WORKER_TTFT, seconds, **labels)
        self.registry.set(self.WORKER_ISL, float(input_tokens), **labels)

    def next_token(self, model: str, worker_id: int, seconds: float) -> None:
        self.registry.observe(self.ITL, seconds, model=model)
        self.registry.set(self.WORKER_ITL, seconds, **self._worker(worker_id))

    def tokens(self, model: str, count: int) -> None:
        if count:
            self.registry.inc(self.OUTPUT_TOKENS, float(count), model=model)

    def finished(
        self,
        model: str,
        request_type: str,
        *,
        seconds: float,
        output_tokens: int,
        error_type: str = "",
        queued: bool = False,
    ) -> None:
        """The request ended (`error_type` empty on success; `queued` when it never produced
        a first token, so it still counts in the HTTP queue gauge)."""
        status = "error" if error_type else "success"
        self.registry.inc(
            self.REQUESTS,
            model=model,
            endpoint=ENDPOINT_COMPLETIONS,
            request_type=request_type,
            status=status,
            error_type=error_type,
        )
        failure = FAILURE_LABELS.get(error_type)
        if failure is not None:
            self.registry.inc_labelled(self.FAILURES, {"class": failure[0], "reason": failure[1]})
        self._shift(self.INFLIGHT, model, -1)
        if queued:
            self._shift(self.QUEUED, model, -1)
        self.registry.observe(self.DURATION, seconds, model=model)
        if not error_type:
            self.registry.observe(self.OUTPUT, float(output_tokens), model=model)

    def disconnected(self) -> None:
        self._shift(self.DISCONNECTED, None, +1)

    def render(self, ready_models: Iterable[str]) -> str:
        """The text page; `model_ready` is read at scrape time, like the real collector."""
        readiness = self.registry._families[self.MODEL_READY].values
        for key in readiness:
            readiness[key] = 0.0
        for model in ready_models:
            self.registry.set(self.MODEL_READY, 1.0, model=model)
        return self.registry.render()

    # -- helpers --------------------------------------------------------------------------------
    def _shift(self, name: str, model: str | None, delta: int) -> None:
        labels = {"model": model} if model is not None else {}
        family = self.registry._families[name]
        key = family.key(labels)
        family.values[key] = family.values.get(key, 0.0) + delta

    @staticmethod
    def _worker(worker_id: int) -> dict[str, str]:
        return {"worker_id": str(worker_id), "dp_rank": UNSET_DP_RANK, "worker_type": WORKER_TYPE}
