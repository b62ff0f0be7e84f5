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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PREFIX = "dynamo_frontend"
ENDPOINT_COMPLETIONS = "completions"
#: Aggregated workers serve both phases; the real frontend labels their timings `decode`.
WORKER_TYPE = "decode"
#: The label value the frontend uses when a worker reports no data-parallel rank.
UNSET_DP_RANK = "none"

Labels = tuple[tuple[str, str], ...]
#: `failures_total`'s (class, reason) for the error types whose labels were observed on the
#: real 1.6.1 frontend; engine failures are not counted there until observed.
FAILURE_LABELS = {
    "validation": ("InvalidRequest", "request.invalid"),
    "not_found": ("NotFound", "request.not_found"),
}


def log_buckets(low: float, high: float, count: int) -> list[float]:
    """Dynamo's `generate_log_buckets`: 0, then `count - 1` log-spaced values from `low` to
    `high`, rounded to 2 significant figures, consecutive duplicates removed."""
    buckets = [0.0]
    for i in range(1, count):
        value = math.exp(math.log(low) + (math.log(high) - math.log(low)) * i / (count - 1))
        rounded = _two_figures(value)
        if rounded != buckets[-1]:
            buckets.append(rounded)
    return buckets


def _two_figures(value: float) -> float:
    scale = 10 ** (1 - math.floor(math.log10(abs(value))))
    return float(round(value * scale) / scale)


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _label_text(labels: Labels, extra: Labels = ()) -> str:
    pairs = [*labels, *extra]
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass
class _Family:
    name: str
    help: str
    kind: str  # counter | gauge | histogram
    label_names: tuple[str, ...]
    buckets: tuple[float, ...] = ()
    values: dict[Labels, float] = field(default_factory=dict)
    #: histogram: per label set, cumulative-free bucket counts, sum and count.
    observations: dict[Labels, tuple[list[int], list[float]]] = field(default_factory=dict)

    def key(self, labels: dict[str, str]) -> Labels:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {sorted(labels)}")
        return tuple((n, str(labels[n])) for n in self.label_names)

    def render(self) -> Iterable[str]:
        if not self.values and not self.observations and self.label_names:
            return
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        if self.kind != "histogram":
            for labels, value in (self.values or {(): 0.0}).items():
                yield f"{self.name}{_label_text(labels)} {_number(value)}"
            return
        for labels, (counts, totals) in self.observations.items():
            running = 0
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                running += count
                le = (("le", _number(bound) if bound != math.inf else "+Inf"),)
                yield f"{self.name}_bucket{_label_text(labels, le)} {running}"
            yield f"{self.name}_sum{_label_text(labels)} {_number(totals[0])}"
            yield f"{self.name}_count{_label_text(labels)} {running}"


class MetricsRegistry:
    """Counters, gauges and histograms with fixed label names, rendered as Prometheus text."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def _add(self, family: _Family) -> None:
        self._families[family.name] = family

    def counter(self, name: str, help: str, labels: Sequence[str]) -> None:
        self._add(_Family(name, help, "counter", tuple(labels)))

    def gauge(self, name: str, help: str, labels: Sequence[str]) -> None:
        self._add(_Family(name, help, "gauge", tuple(labels)))

    def histogram(self, name: str, help: str, labels: Sequence[str], buckets: list[float]) -> None:
        self._add(_Family(name, help, "histogram", tuple(labels), tuple(buckets)))

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self.inc_labelled(name, labels, amount)

    def inc_labelled(self, name: str, labels: dict[str, str], amount: float = 1.0) -> None:
        """`inc` for label names that are Python keywords (`class`)."""
        family = self._families[name]
        key = family.key(labels)
        family.values[key] = family.values.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        family = self._families[name]
        family.values[family.key(labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        family = self._families[name]
        key = family.key(labels)
        counts, totals = family.observations.setdefault(
            key, ([0] * (len(family.buckets) + 1), [0.0])
        )
        # `le` is inclusive: a value equal to a bound falls in that bucket.
        index = next((i for i, b in enumerate(family.buckets) if value <= b), len(family.buckets))
        counts[index] += 1
        totals[0] += value

    def render(self) -> str:
        lines: list[str] = []
        for family in self._families.values():
            lines.extend(family.render())
        return "\n".join(lines) + "\n"


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
