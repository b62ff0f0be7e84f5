"""Serving health read from Dynamo's Prometheus text: the frontend's `/metrics` and a worker's
system server `/metrics` (docs/reference/dynamo-scoring.md lists what 1.6.1 exposes).

A snapshot is the counters and histograms at one instant; `serving_delta` and `worker_delta`
turn two snapshots into rates, an error ratio and latency quantiles over the window between
them, as Prometheus' `rate()` and `histogram_quantile()` would. The frontend counts requests
and errors per model only; per worker it keeps just the last time to first token and
inter-token latency (gauges). Per-worker request and error COUNTS come from each worker's
system server (`dynamo_component_requests_total` / `_errors_total`, worker id in hex).

The text is outside data: read up to a size cap, parsed by prometheus_client's parser with a
sample cap, and every value we use checked (a counter that is negative or not finite, a
histogram whose buckets go down, are dropped and named in `problems`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from .errors import CallTimeout, TransportError, one_line
from .http import NO_BODY, DynamoClient
from .policy import OutboundPolicy

MAX_METRICS_BYTES = 4 * 1024 * 1024
#: A 1.6.1 frontend with one model exposes ~800 samples; thousands of models or workers stay
#: far below this, an endless exposition does not.
MAX_SAMPLES = 200_000
FRONTEND_PREFIX = "dynamo_frontend"
MAX_PROBLEMS = 20
QUANTILES = (0.5, 0.9, 0.99)


class MetricsError(Exception):
    """The metrics could not be read at all; `reason` is one line for an operator."""

    def __init__(self, reason: str) -> None:
        self.reason = one_line(reason)
        super().__init__(self.reason)


# -- histograms ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts by upper bound (ascending, the last one +Inf)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float

    @property
    def count(self) -> float:
        return self.cumulative[-1]

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since `earlier`; all of them when the bounds changed or the
        counts went down (the process restarted and its histogram began again)."""
        if earlier is None or earlier.bounds != self.bounds:
            return self
        diff = tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative, strict=True))
        if any(d < 0 for d in diff):
            return self
        return Histogram(self.bounds, diff, max(self.sum - earlier.sum, 0.0))

    def quantile(self, q: float) -> float | None:
        """Prometheus' `histogram_quantile`: linear within the bucket holding the rank; the
        highest finite bound when the rank falls in +Inf; None without observations."""
        total = self.count
        if not 0 <= q <= 1 or total <= 0:
            return None
        rank = q * total
        previous_bound, previous_count = 0.0, 0.0
        for bound, cumulative in zip(self.bounds, self.cumulative, strict=True):
            if cumulative >= rank and cumulative > previous_count:
                if math.isinf(bound):
                    return previous_bound
                if bound <= 0:
                    return bound
                share = (rank - previous_count) / (cumulative - previous_count)
                return previous_bound + (bound - previous_bound) * share
            previous_bound, previous_count = bound, cumulative
        return previous_bound

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


# -- parsing ------------------------------------------------------------------------------------


Labels = tuple[tuple[str, str], ...]


@dataclass
class _Samples:
    """Samples by name and label set, checked as they are collected."""

    values: dict[str, dict[Labels, float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(one_line(text, 200))

    def series(self, name: str) -> dict[Labels, float]:
        return self.values.get(name, {})

    def histograms(self, base: str, keep: Iterable[str]) -> dict[Labels, Histogram]:
        """Histograms named `base` by the label set `keep` (other labels summed over)."""
        keep = tuple(keep)
        buckets: dict[Labels, dict[float, float]] = {}
        sums: dict[Labels, float] = {}
        for labels, value in self.series(base + "_bucket").items():
            found = dict(labels)
            try:
                bound = float(found.pop("le"))
            except (KeyError, ValueError):
                self.problem(f"{base}_bucket without a numeric le label")
                continue
            key = _pick(found, keep)
            per = buckets.setdefault(key, {})
            per[bound] = per.get(bound, 0.0) + value
        for labels, value in self.series(base + "_sum").items():
            key = _pick(dict(labels), keep)
            sums[key] = sums.get(key, 0.0) + value
        out: dict[Labels, Histogram] = {}
        for key, per in buckets.items():
            bounds = tuple(sorted(per))
            cumulative = tuple(per[b] for b in bounds)
            if not bounds or not math.isinf(bounds[-1]):
                self.problem(f"{base}{dict(key)} has no +Inf bucket")
            elif any(b < a for a, b in itertools.pairwise(cumulative)):
                self.problem(f"{base}{dict(key)} has buckets that go down")
            else:
                out[key] = Histogram(bounds, cumulative, sums.get(key, 0.0))
        return out


def _pick(labels: Mapping[str, str], keep: tuple[str, ...]) -> Labels:
    return tuple((k, labels.get(k, "")) for k in keep)


def collect_samples(text: str, wanted: Iterable[str]) -> _Samples:
    """The samples whose name starts with one of `wanted`, from Prometheus text.

    Raises MetricsError when the text is too large, too long, or not the text format.
    """
    if len(text) > MAX_METRICS_BYTES:
        raise MetricsError(f"metrics text is over {MAX_METRICS_BYTES} bytes")
    prefixes = tuple(wanted)
    samples = _Samples()
    seen = 0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                seen += 1
                if seen > MAX_SAMPLES:
                    raise MetricsError(f"more than {MAX_SAMPLES} samples")
                if not sample.name.startswith(prefixes):
                    continue
                value = sample.value
                if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                    # Every series we read is a count, a duration or a bucket: never negative.
                    samples.problem(f"{sample.name}{sample.labels} = {value!r} dropped")
                    continue
                labels = tuple(sorted(sample.labels.items()))
                samples.values.setdefault(sample.name, {})[labels] = float(value)
    except MetricsError:
        raise
    except Exception as exc:  # the library's parser raises several types on garbage input
        raise MetricsError(f"not Prometheus text: {type(exc).__name__}: {exc}") from None
    return samples


# -- the frontend -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelServing:
    """One model's counters at the frontend (all endpoints and request types summed)."""

    requests: float
    errors: float
    errors_by_type: Mapping[str, float]
    ttft: Histogram | None
    duration: Histogram | None
    inflight: float | None


@dataclass(frozen=True, slots=True)
class WorkerLatency:
    """What the frontend last saw from one worker (gauges, not counts)."""

    last_ttft_s: float | None
    last_itl_s: float | None


@dataclass(frozen=True, slots=True)
class FrontendSnapshot:
    taken_at: float
    models: Mapping[str, ModelServing]
    #: By decimal instance id, as the frontend labels it (`worker_id`).
    workers: Mapping[str, WorkerLatency]
    problems: tuple[str, ...] = ()


def parse_frontend_metrics(
    text: str, *, taken_at: float, prefix: str = FRONTEND_PREFIX
) -> FrontendSnapshot:
    """A snapshot from the frontend's exposition; raises MetricsError only."""
    samples = collect_samples(text, [prefix + "_"])
    requests: dict[str, float] = {}
    errors: dict[str, dict[str, float]] = {}
    for labels, value in samples.series(f"{prefix}_requests_total").items():
        found = dict(labels)
        model = found.get("model", "")
        requests[model] = requests.get(model, 0.0) + value
        if found.get("status") == "error":
            kind = found.get("error_type") or "unknown"
            per = errors.setdefault(model, {})
            per[kind] = per.get(kind, 0.0) + value
    ttft = samples.histograms(f"{prefix}_time_to_first_token_seconds", ["model"])
    duration = samples.histograms(f"{prefix}_request_duration_seconds", ["model"])
    inflight = {
        dict(labels).get("model", ""): value
        for labels, value in samples.series(f"{prefix}_inflight_requests").items()
    }
    names = set(requests) | {k[0][1] for k in ttft} | {k[0][1] for k in duration}
    models = {
        model: ModelServing(
            requests=requests.get(model, 0.0),
            errors=sum(errors.get(model, {}).values()),
            errors_by_type=dict(errors.get(model, {})),
            ttft=ttft.get((("model", model),)),
            duration=duration.get((("model", model),)),
            inflight=inflight.get(model),
        )
        for model in sorted(names)
    }
    last_ttft = _by_worker(samples.series(f"{prefix}_worker_last_time_to_first_token_seconds"))
    last_itl = _by_worker(samples.series(f"{prefix}_worker_last_inter_token_latency_seconds"))
    workers = {
        w: WorkerLatency(last_ttft.get(w), last_itl.get(w))
        for w in sorted(set(last_ttft) | set(last_itl))
    }
    return FrontendSnapshot(taken_at, models, workers, tuple(samples.problems))


def _by_worker(series: Mapping[Labels, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in series.items():
        worker = dict(labels).get("worker_id", "")
        if worker.isascii() and worker.isdigit():
            out[worker] = value
    return out


@dataclass(frozen=True, slots=True)
class ServingDelta:
    """One model's serving over the window between two snapshots."""

    seconds: float
    requests: float
    errors: float
    request_rate: float
    error_rate: float
    #: Errors over requests; None without requests in the window.
    error_ratio: float | None
    #: Estimated from the window's histogram buckets, milliseconds (None: no observations).
    ttft_ms: Mapping[float, float | None]
    duration_ms: Mapping[float, float | None]
    #: A counter went down: the frontend restarted, counts are from its restart on.
    reset: bool = False


def _increase(after: float, before: float | None) -> tuple[float, bool]:
    if before is None:
        return after, False
    if after < before:
        return after, True
    return after - before, False


def _quantiles_ms(hist: Histogram | None) -> dict[float, float | None]:
    out: dict[float, float | None] = {}
    for q in QUANTILES:
        value = hist.quantile(q) if hist is not None else None
        out[q] = None if value is None else value * 1000
    return out


def serving_delta(before: FrontendSnapshot, after: FrontendSnapshot) -> dict[str, ServingDelta]:
    """Per model of `after`: rates, error ratio and latency quantiles since `before`.

    Raises ValueError when `after` was not taken after `before` (a rate needs a window).
    """
    seconds = after.taken_at - before.taken_at
    if not seconds > 0:
        raise ValueError("the later snapshot must be taken after the earlier one")
    out: dict[str, ServingDelta] = {}
    for model, now in after.models.items():
        then = before.models.get(model)
        requests, reset_r = _increase(now.requests, then.requests if then else None)
        errors, reset_e = _increase(now.errors, then.errors if then else None)
        errors = min(errors, requests) if requests else errors
        ttft = now.ttft.minus(then.ttft if then else None) if now.ttft else None
        duration = now.duration.minus(then.duration if then else None) if now.duration else None
        out[model] = ServingDelta(
            seconds=seconds,
            requests=requests,
            errors=errors,
            request_rate=requests / seconds,
            error_rate=errors / seconds,
            error_ratio=errors / requests if requests > 0 else None,
            ttft_ms=_quantiles_ms(ttft),
            duration_ms=_quantiles_ms(duration),
            reset=reset_r or reset_e,
        )
    return out


# -- a worker's system server -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerCounters:
    """One instance's work handler counts for one endpoint (default `generate`)."""

    requests: float
    errors: float
    cancellations: float
    duration: Histogram | None


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    taken_at: float
    #: By instance id (the exposition labels it in hex; converted here).
    workers: Mapping[int, WorkerCounters]
    problems: tuple[str, ...] = ()


def parse_worker_metrics(
    text: str, *, taken_at: float, endpoint: str = "generate"
) -> WorkerSnapshot:
    """A snapshot from a worker's system server exposition; raises MetricsError only."""
    samples = collect_samples(text, ["dynamo_component_"])

    def per_instance(name: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for labels, value in samples.series(name).items():
            found = dict(labels)
            if found.get("dynamo_endpoint") != endpoint:
                continue
            instance = _hex_instance(found.get("worker_id", ""))
            if instance is None:
                samples.problem(f"{name} with worker_id {found.get('worker_id')!r} skipped")
                continue
            out[instance] = out.get(instance, 0.0) + value
        return out

    requests = per_instance("dynamo_component_requests_total")
    errors = per_instance("dynamo_component_errors_total")
    cancellations = per_instance("dynamo_component_cancellation_total")
    histograms = samples.histograms(
        "dynamo_component_request_duration_seconds", ["dynamo_endpoint", "worker_id"]
    )
    durations: dict[int, Histogram] = {}
    for key, hist in histograms.items():
        found = dict(key)
        instance = _hex_instance(found["worker_id"])
        if found["dynamo_endpoint"] == endpoint and instance is not None:
            durations[instance] = hist
    workers = {
        instance: WorkerCounters(
            requests=requests.get(instance, 0.0),
            errors=errors.get(instance, 0.0),
            cancellations=cancellations.get(instance, 0.0),
            duration=durations.get(instance),
        )
        for instance in sorted(set(requests) | set(errors) | set(durations))
    }
    return WorkerSnapshot(taken_at, workers, tuple(samples.problems))


def _hex_instance(text: str) -> int | None:
    """1.6.1 labels a worker's series with its instance id in lower-case hex, no `0x`."""
    if not 0 < len(text) <= 16 or any(c not in "0123456789abcdef" for c in text):
        return None
    return int(text, 16)


@dataclass(frozen=True, slots=True)
class WorkerDelta:
    seconds: float
    requests: float
    errors: float
    request_rate: float
    error_ratio: float | None
    duration_ms: Mapping[float, float | None]
    reset: bool = False


def worker_delta(before: WorkerSnapshot, after: WorkerSnapshot) -> dict[int, WorkerDelta]:
    """Per instance of `after`: its counts since `before` (the same worker's system server)."""
    seconds = after.taken_at - before.taken_at
    if not seconds > 0:
        raise ValueError("the later snapshot must be taken after the earlier one")
    out: dict[int, WorkerDelta] = {}
    for instance, now in after.workers.items():
        then = before.workers.get(instance)
        requests, reset_r = _increase(now.requests, then.requests if then else None)
        errors, reset_e = _increase(now.errors, then.errors if then else None)
        duration = now.duration.minus(then.duration if then else None) if now.duration else None
        out[instance] = WorkerDelta(
            seconds=seconds,
            requests=requests,
            errors=errors,
            request_rate=requests / seconds,
            error_ratio=min(errors / requests, 1.0) if requests > 0 else None,
            duration_ms=_quantiles_ms(duration),
            reset=reset_r or reset_e,
        )
    return out


# -- fetching -----------------------------------------------------------------------------------


async def _fetch_text(client: DynamoClient, url: str, timeout: float) -> str:
    try:
        reply = await client.send(
            "GET",
            url,
            json_body=NO_BODY,
            timeout=timeout,
            limit=MAX_METRICS_BYTES,
            error_limit=16 * 1024,
            accept="text/plain",
        )
    except CallTimeout:
        raise MetricsError(f"metrics timed out after {timeout:g}s") from None
    except TransportError as exc:
        raise MetricsError(f"metrics unreachable: {exc.reason}") from None
    if reply.raw is None:
        raise MetricsError(f"metrics text is over {MAX_METRICS_BYTES} bytes")
    if reply.status != 200:
        raise MetricsError(f"metrics answered HTTP {reply.status}")
    try:
        return reply.raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MetricsError("metrics text is not UTF-8") from None


async def fetch_frontend_snapshot(
    client: DynamoClient,
    frontend_url: str,
    *,
    policy: OutboundPolicy,
    timeout: float,
    clock: Callable[[], float] = time.time,
) -> FrontendSnapshot:
    """GET `{frontend_url}/metrics` under the outbound policy; raises MetricsError only."""
    url = frontend_url.rstrip("/") + "/metrics"
    violation = await policy.aviolation(url)
    if violation is not None:
        raise MetricsError(f"outbound policy: {violation}")
    text = await _fetch_text(client, url, timeout)
    return parse_frontend_metrics(text, taken_at=clock())


async def fetch_worker_snapshot(
    client: DynamoClient,
    system_url: str,
    *,
    policy: OutboundPolicy,
    timeout: float,
    clock: Callable[[], float] = time.time,
) -> WorkerSnapshot:
    """GET `{system_url}/metrics` (a worker's system server, the admin address rules apply);
    raises MetricsError only."""
    violation = await policy.admin_violation(system_url)
    if violation is not None:
        raise MetricsError(f"outbound policy: {violation}")
    text = await _fetch_text(client, system_url.rstrip("/") + "/metrics", timeout)
    return parse_worker_metrics(text, taken_at=clock())
