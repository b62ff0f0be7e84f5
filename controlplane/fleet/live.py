"""Live fleet streams: what a discovery run publishes, and the HTML each stream sends.

Groups: `fleet` (overview) and `fleet.source.<id>` (source page). A discovery run announces the
source by id (each receiving process renders its card, summary, timeline and charts once) and
publishes only the rows it touched, each rendered once here for every subscriber; the consumer
picks the rows its client's page shows (`consumers.SourceStreamConsumer`). A gate
or policy refresh change publishes the summary alone: it holds the gate and drift badges, and no row
of the worker table changes with a gate.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache

from django.http import QueryDict
from django.template.loader import render_to_string
from django.utils import timezone

from controlplane.fleet.filters import WorkerFilter
from controlplane.fleet.models import Source, Worker, WorkerEvent
from controlplane.fleet.presenters import summarise, summarise_all, version_label
from controlplane.fleet.rows import render_row, render_rows, render_timeline
from controlplane.realtime import publish

logger = logging.getLogger(__name__)

FLEET_GROUP = "fleet"
#: Above this many touched rows a push says "resync" and each client re-reads the table.
LIVE_ROW_LIMIT = 300
TIMELINE_WINDOW = timedelta(days=1)
TIMELINE_LIMIT = 200

EVENT_SOURCES_CHANGED = "fleet.sources_changed"
EVENT_DISCOVERY_FINISHED = "fleet.discovery_finished"
EVENT_WORKERS_CHANGED = "fleet.workers_changed"
#: The summary (gate and drift badges, counts) changed; no row did.
EVENT_SUMMARY_CHANGED = "fleet.summary_changed"
#: Workers changed, so the overview's version chart did (payload: a stamp; rendered by each
#: receiving process once).
EVENT_CHARTS_CHANGED = "fleet.charts_changed"


def source_group(source_id: int) -> str:
    return f"fleet.source.{source_id}"


def timeline(source: Source):
    since = timezone.now() - TIMELINE_WINDOW
    return (
        WorkerEvent.objects.filter(source=source, occurred_at__gte=since)
        .select_related("worker")
        .order_by("-occurred_at", "-id")[:TIMELINE_LIMIT]
    )


def card_html(source: Source) -> str:
    return render_to_string(
        "fleet/overview.html#source-card", {"summary": summarise(source), "card_oob": True}
    )


def overview_html() -> str:
    summaries = summarise_all(Source.objects.all())
    return render_to_string(
        "fleet/overview.html#source-cards",
        {"summaries": summaries, "oob": True},
    )


def overview_charts_html() -> str:
    """The overview's version chart (one aggregate query), as an out-of-band swap."""
    return render_to_string("fleet/_charts_overview.html#version-figure", {"oob": True})


def source_charts_html(source: Source, *, with_map: bool = True) -> str:
    """The source page's version chart, and (`with_map`) the trigger that makes the page
    re-read its fleet map: the map has a cell per worker, too big to send to every subscriber
    on every change, so each page fetches it once per push. A (re)connect sends the chart
    only: the page has just loaded its map itself."""
    context = {"source": source, "oob": True}
    html = render_to_string("fleet/_charts_source.html#version-figure", context)
    if with_map:
        html += render_to_string("fleet/_charts_source.html#map-refetch", context)
    return html


def summary_html(source: Source, *, oob: bool = True) -> str:
    return render_to_string("fleet/source.html#summary", {"summary": summarise(source), "oob": oob})


def timeline_html(source: Source, *, oob: bool = True) -> str:
    return render_to_string(
        "fleet/source.html#timeline", {"events_html": render_timeline(timeline(source)), "oob": oob}
    )


@dataclass(frozen=True, slots=True)
class PageTable:
    """One page of the worker table as a stream sends it, and what the page holds."""

    html: str
    shown: frozenset[int]
    #: Only the last page takes newcomers; a full or middle page leaves them to later pages.
    is_last: bool


def table_html(source: Source | int, flt: WorkerFilter) -> PageTable:
    """The visible page's `<tbody>` (at most `PAGE_SIZE` rows), for a (re)connecting client."""
    page = flt.page_of(source)
    rows = list(page.object_list)
    body = f'<tbody id="worker-rows" hx-swap-oob="true">{render_rows(rows)}</tbody>'
    return PageTable(body, frozenset(w.pk for w in rows), not page.has_next())


@lru_cache(maxsize=32)
def shared_table_html(source_id: int, query: str, stamp: str) -> PageTable:
    """`table_html` once per (event, view) in this process: after a big refresh every
    subscriber that shows the same page of the same view shares one render."""
    return table_html(source_id, WorkerFilter.from_query(QueryDict(query)))


def row_payload(w: Worker) -> dict:
    """A changed row, rendered once, with what a stream's filter judges it by."""
    return {
        "id": w.pk,
        "html": str(render_row(w)),
        "namespace": w.namespace,
        "component": w.component,
        "endpoint": w.endpoint,
        "instance_id": w.instance_id,
        "model": w.model,
        "state": w.state,
        "version": version_label(w.weight_version),
        "routes": list(w.routes or ()),
    }


def publish_overview() -> None:
    publish(FLEET_GROUP, EVENT_SOURCES_CHANGED, {})


def publish_refresh(source_id: int, worker_ids: list[int]) -> None:
    """After a discovery run commits: the source's card, header, timeline and charts are
    announced by id and a stamp naming this run, and each receiving process renders them once
    for all its subscribers (`shared_*`); the touched rows travel rendered (`row_payload`),
    or, above `LIVE_ROW_LIMIT`, a resync. The run itself renders no card, summary, timeline or
    chart: those are several queries and templates per run, and a plan's discovery (on the
    way from a trainer's webhook to the refresh) would wait for them, for pages a process
    nobody watches would never show."""
    try:
        stamp = uuid.uuid4().hex
        announced = {"source_id": source_id, "stamp": stamp}
        publish(FLEET_GROUP, EVENT_DISCOVERY_FINISHED, announced)
        payload: dict = {**announced, "workers_moved": bool(worker_ids)}
        if worker_ids:
            # Versions and states moved: the charts that count them follow.
            publish(FLEET_GROUP, EVENT_CHARTS_CHANGED, {"stamp": stamp})
        if len(worker_ids) > LIVE_ROW_LIMIT:
            # Too many rows to ship to every subscriber: each re-reads its visible page, and
            # subscribers of this process showing the same view share that read (`stamp`).
            payload["resync"] = True
        elif worker_ids:
            payload["rows"] = [row_payload(w) for w in Worker.objects.filter(pk__in=worker_ids)]
        publish(source_group(source_id), EVENT_WORKERS_CHANGED, payload)
    except Exception:  # a lost push is repaired by the next resync; never fail the discovery run
        logger.exception("publishing the discovery run of source %s failed", source_id)


def publish_summary(source_ids) -> None:
    """A gate, drift entry or policy refresh of these sources changed: their summaries and
    overview cards. Only the source id travels (and a stamp naming this change); each
    receiving process renders the card and the summary once for all its subscribers
    (`shared_source_html`), so the publisher — a policy refresh's
    executor, ten state changes a run — runs no query and no template for it, and a process
    nobody watches renders nothing. The worker table is untouched: no row shows a gate, so
    nothing of the table travels."""
    for source_id in sorted(set(source_ids)):
        payload = {"source_id": source_id, "stamp": uuid.uuid4().hex}
        try:
            publish(FLEET_GROUP, EVENT_DISCOVERY_FINISHED, payload)
            publish(source_group(source_id), EVENT_SUMMARY_CHANGED, payload)
        except Exception:  # best effort, like every push; the next resync repairs it
            logger.exception("publishing the summary of source %s failed", source_id)


#: The parts of a source's pages a stream is sent after an announced change, by name: the
#: overview's card, and the source page's summary, timeline and charts.
SOURCE_PARTS: dict[str, Callable[[Source], str]] = {
    "card": card_html,
    "summary": summary_html,
    "timeline": timeline_html,
    "charts": source_charts_html,
}


@lru_cache(maxsize=4 * 32)
def shared_source_html(part: str, source_id: int, stamp: str) -> str:
    """One part (`SOURCE_PARTS`) of one source's pages after one announced change, rendered
    once per process for all its subscribers ("" once the source is gone)."""
    source = Source.objects.filter(pk=source_id).first()
    return "" if source is None else SOURCE_PARTS[part](source)


@lru_cache(maxsize=32)
def shared_overview_charts_html(stamp: str) -> str:
    """The overview's version chart after one announced change, once per process."""
    return overview_charts_html()
