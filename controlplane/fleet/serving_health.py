"""Serving health: a source's request rate, error rate and latency, sampled from its Dynamo
frontend's Prometheus `/metrics` (docs/operate/serving-health.md).

A beat task (`fleet.sample_serving_health`, every `SERVING_HEALTH_SAMPLE_SECONDS`) reads one
snapshot per enabled source with a frontend URL, under the source's outbound policy, and
writes one `ServingHealthPoint`: the rates and latency over the window since the previous
snapshot, as Prometheus' `rate()` and `histogram_quantile()` would compute them
(`dynamo.frontend_metrics`). A frontend that cannot be read gives a point with `error` and no
figures; nothing raises out of the task.

What one point sums: the frontend counts per model; a point is the whole source, so each
model's increase is taken on its own (a model that restarts or leaves does not turn into a
reset of the sum) and the increases are added, the latency histograms' increases likewise
before the quantiles are taken. The busiest models keep their own figures in `by_model`.

Where things live, and why: the points in PostgreSQL, a ring per source pruned by age on each
tick (the chart survives a restart of anything, and the prune is one indexed delete); the
previous snapshot, which only the next tick needs, in the cache (Redis) for a few intervals.
Losing it costs one interval: the next tick only stores a new baseline.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from django.utils.safestring import SafeString

from controlplane import charts
from controlplane.dynamo import limits
from controlplane.dynamo.errors import one_line
from controlplane.dynamo.frontend_metrics import (
    FrontendSnapshot,
    Histogram,
    MetricsError,
    fetch_frontend_snapshot,
    serving_delta,
)
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet.models import ServingHealthPoint, Source

logger = logging.getLogger(__name__)

SAMPLE_TASK = "fleet.sample_serving_health"
#: Models kept per point with their own figures (the busiest of the window).
MAX_MODELS = 12
#: Sources read at once by one tick.
CONCURRENCY = 32
#: What the fragment draws by default, and the longest window it accepts.
WINDOW = timedelta(minutes=15)
#: Points drawn per chart at most: beyond that, each drawn point is the worst of its group.
MAX_DRAWN = 180


class ModelPointJson(TypedDict):
    request_rate: float
    error_rate: float
    error_ratio: float | None
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None


#: By model name, as the frontend labels it (an unknown model's requests: `unknown_model`).
ServingModels = dict[str, ModelPointJson]


# -- reading ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reading:
    """What one tick read from one source's frontend: a snapshot, or why not."""

    source_id: int
    frontend_url: str
    snapshot: FrontendSnapshot | None
    error: str = ""


def timeout_seconds() -> float:
    """Each read ends well inside the tick, so ticks never pile up behind a slow frontend."""
    return max(0.5, min(3.0, settings.SERVING_HEALTH_SAMPLE_SECONDS * 0.6))


async def read_frontends(sources: Sequence[Source], *, timeout: float) -> list[Reading]:
    """One snapshot per source, read concurrently; every failure becomes the reading's error."""
    limit = asyncio.Semaphore(CONCURRENCY)
    async with make_client(timeout=timeout, max_connections=CONCURRENCY) as client:

        async def read(source: Source) -> Reading:
            url = source.frontend_url
            try:
                policy = OutboundPolicy.from_cidrs(source.allowed_networks or [])
            except ValueError:
                return Reading(source.pk, url, None, "the source's allowed networks are invalid")
            async with limit:
                try:
                    snapshot = await fetch_frontend_snapshot(
                        client, url, policy=policy.for_run(), timeout=timeout
                    )
                except MetricsError as exc:
                    return Reading(source.pk, url, None, exc.reason)
                except Exception as exc:  # a bug must not cost the other sources their point
                    logger.exception("serving health of source %s failed", source.pk)
                    return Reading(source.pk, url, None, one_line(f"{type(exc).__name__}: {exc}"))
            return Reading(source.pk, url, snapshot)

        return await asyncio.gather(*(read(s) for s in sources))


# -- one point from two snapshots ----------------------------------------------------------------


def _sum(histograms: Iterable[Histogram | None]) -> Histogram | None:
    """The histograms added up; ones with other bucket bounds than the first are left out
    (1.6.1 gives every model the same bounds, so this never drops one in practice)."""
    present = [h for h in histograms if h is not None]
    if not present:
        return None
    bounds = present[0].bounds
    same = [h for h in present if h.bounds == bounds]
    cumulative = tuple(sum(column) for column in zip(*(h.cumulative for h in same), strict=True))
    return Histogram(bounds, cumulative, sum(h.sum for h in same))


def _ms(hist: Histogram | None, q: float) -> float | None:
    value = hist.quantile(q) if hist is not None else None
    return None if value is None else value * 1000


def point_fields(before: FrontendSnapshot, after: FrontendSnapshot) -> dict[str, Any]:
    """The point's figures for the window between two snapshots of one frontend.

    Raises ValueError when `after` was not taken after `before`."""
    per_model = serving_delta(before, after)
    seconds = after.taken_at - before.taken_at
    requests = sum(d.requests for d in per_model.values())
    errors = sum(d.errors for d in per_model.values())
    ttft: list[Histogram | None] = []
    duration: list[Histogram | None] = []
    for model, now in after.models.items():
        then = before.models.get(model)
        ttft.append(now.ttft.minus(then.ttft if then else None) if now.ttft else None)
        duration.append(
            now.duration.minus(then.duration if then else None) if now.duration else None
        )
    window_ttft, window_duration = _sum(ttft), _sum(duration)
    busiest = sorted(per_model.items(), key=lambda item: (-item[1].requests, item[0]))
    by_model: ServingModels = {
        model[: limits.MODEL_MAX]: {
            "request_rate": d.request_rate,
            "error_rate": d.error_rate,
            "error_ratio": d.error_ratio,
            "ttft_p50_ms": d.ttft_ms.get(0.5),
            "ttft_p90_ms": d.ttft_ms.get(0.9),
        }
        for model, d in busiest[:MAX_MODELS]
    }
    return {
        "seconds": seconds,
        "request_rate": requests / seconds,
        "error_rate": errors / seconds,
        "error_ratio": errors / requests if requests > 0 else None,
        "ttft_p50_ms": _ms(window_ttft, 0.5),
        "ttft_p90_ms": _ms(window_ttft, 0.9),
        "duration_p50_ms": _ms(window_duration, 0.5),
        "duration_p90_ms": _ms(window_duration, 0.9),
        "reset": any(d.reset for d in per_model.values()),
        "by_model": by_model,
    }


# -- recording ----------------------------------------------------------------------------------


def baseline_key(source_id: int, frontend_url: str) -> str:
    """Per source and frontend URL: a source pointed at another frontend starts afresh
    instead of subtracting one frontend's counters from another's."""
    digest = hashlib.sha256(frontend_url.encode()).hexdigest()[:16]
    return f"serving-health:{source_id}:{digest}"


def baseline_ttl() -> int:
    """A baseline older than a few ticks (beat stopped a while) is not one to compute a rate
    from: the next sample after a gap starts a new window instead of averaging over it."""
    return max(30, math.ceil(settings.SERVING_HEALTH_SAMPLE_SECONDS * 4))


def record(reading: Reading) -> ServingHealthPoint | None:
    """The point of one reading (None: the first snapshot, kept as the next one's baseline)."""
    if reading.snapshot is None:
        return ServingHealthPoint.objects.create(
            source_id=reading.source_id, taken_at=timezone.now(), error=reading.error
        )
    key = baseline_key(reading.source_id, reading.frontend_url)
    before = cache.get(key)
    after = reading.snapshot
    cache.set(key, after, baseline_ttl())
    if not isinstance(before, FrontendSnapshot) or after.taken_at <= before.taken_at:
        return None
    return ServingHealthPoint.objects.create(
        source_id=reading.source_id,
        taken_at=datetime.fromtimestamp(after.taken_at, tz=UTC),
        **point_fields(before, after),
    )


def prune(now: datetime | None = None) -> int:
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.SERVING_HEALTH_KEEP_SECONDS)
    deleted, _ = ServingHealthPoint.objects.filter(taken_at__lt=cutoff).delete()
    return deleted


def sample_all() -> int:
    """One tick: read every enabled source's frontend, record a point each, prune the rings.
    Returns the number of sources read."""
    sources = list(
        Source.objects.filter(enabled=True)
        .exclude(frontend_url="")
        .only("pk", "frontend_url", "allowed_networks")
    )
    readings = asyncio.run(read_frontends(sources, timeout=timeout_seconds())) if sources else []
    for reading in readings:
        try:
            record(reading)
        except Exception:  # one source's write must not cost the others theirs
            logger.exception("recording serving health of source %s failed", reading.source_id)
    prune()
    return len(readings)


# -- the chart fragment -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthView:
    window: timedelta
    #: The window as the page names it ("15 min").
    window_label: str
    start: datetime
    end: datetime
    points: int
    failed: int
    last: ServingHealthPoint | None
    last_error: ServingHealthPoint | None
    #: The newest sample failed: the frontend cannot be read now.
    down: bool
    request_chart: SafeString
    error_chart: SafeString
    latency_chart: SafeString
    models: list[tuple[str, ModelPointJson]]


def _grouped(points: list[ServingHealthPoint]) -> list[list[ServingHealthPoint]]:
    """At most MAX_DRAWN groups of consecutive points (each its own group when few)."""
    size = max(1, math.ceil(len(points) / MAX_DRAWN))
    return [points[i : i + size] for i in range(0, len(points), size)]


def _worst(group: list[ServingHealthPoint], field: str) -> float | None:
    """The group's highest value (rates, errors and latency are all worse higher), so a short
    spike is never averaged away; None when no point of it has one (no requests, no TTFT)."""
    values = [getattr(p, field) for p in group if getattr(p, field) is not None]
    return max(values) if values else None


def _title(group: list[ServingHealthPoint], text: str) -> str:
    return f"{group[-1].taken_at:%H:%M:%S} UTC: {text}"


def _rate(value: float) -> str:
    return f"{value:.3g}/s"


def health_view(source: Source, *, window: timedelta = WINDOW) -> HealthView:
    end = timezone.now()
    start = end - window
    rows = list(
        ServingHealthPoint.objects.filter(source=source, taken_at__gte=start).order_by(
            "taken_at", "id"
        )
    )
    ok = [p for p in rows if not p.error]
    failed = [p for p in rows if p.error]
    groups = _grouped(ok)

    def line(name: str, cls: str, field: str, unit: Callable[[float], str]) -> charts.Line:
        drawn = [(g, v) for g in groups if (v := _worst(g, field)) is not None]
        return charts.Line(name, cls, [(_title(g, unit(v)), v) for g, v in drawn])

    minutes = f"{window.total_seconds() / 60:g} min"
    last = ok[-1] if ok else None
    models = sorted(
        ((name, fig) for name, fig in ((last.by_model or {}) if last else {}).items()),
        key=lambda item: -item[1]["request_rate"],
    )
    return HealthView(
        window=window,
        window_label=minutes,
        start=start,
        end=end,
        points=len(ok),
        failed=len(failed),
        last=last,
        last_error=failed[-1] if failed else None,
        down=bool(rows and rows[-1].error),
        request_chart=charts.lines(
            [line("requests", "chart-v0", "request_rate", _rate)],
            unit=_rate,
            label=f"Requests per second at {source.name}'s frontend, last {minutes}",
        ),
        error_chart=charts.lines(
            [line("errors", "chart-v1", "error_rate", _rate)],
            unit=_rate,
            label=f"Errors per second at {source.name}'s frontend, last {minutes}",
        ),
        latency_chart=charts.lines(
            [
                line("TTFT p50", "chart-v0", "ttft_p50_ms", charts.format_ms),
                line("TTFT p90", "chart-v1", "ttft_p90_ms", charts.format_ms),
            ],
            label=f"Time to first token p50 and p90 at {source.name}'s frontend, last {minutes}",
        ),
        models=models,
    )
