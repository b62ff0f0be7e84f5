"""Live fleet streams: what a refresh publishes, and the HTML each stream sends.

Groups: `fleet` (overview) and `fleet.source.<id>` (source page). A refresh publishes only the
rows it touched; the consumer turns them into htmx out-of-band swaps for its client. Rendering
happens once per refresh here, not once per subscriber.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.template.loader import render_to_string
from django.utils import timezone

from controlplane.fleet.filters import WorkerFilter
from controlplane.fleet.models import Source, Worker, WorkerEvent
from controlplane.fleet.presenters import summarise, version_label
from controlplane.fleet.rows import render_row, render_rows
from controlplane.realtime import publish

logger = logging.getLogger(__name__)

FLEET_GROUP = "fleet"
#: Above this many touched rows a push says "resync" and each client re-reads the table.
LIVE_ROW_LIMIT = 300
TIMELINE_WINDOW = timedelta(days=1)
TIMELINE_LIMIT = 200

EVENT_SOURCES_CHANGED = "fleet.sources_changed"
EVENT_SOURCE_REFRESHED = "fleet.source_refreshed"
EVENT_WORKERS_CHANGED = "fleet.workers_changed"


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
        "fleet/overview.html#source-card",
        {"summary": summarise(source), "card_oob": True},
    )


def overview_html() -> str:
    summaries = [summarise(s) for s in Source.objects.all()]
    return render_to_string(
        "fleet/overview.html#source-cards",
        {"summaries": summaries, "oob": True},
    )


def summary_html(source: Source, *, oob: bool = True) -> str:
    return render_to_string(
        "fleet/source.html#summary",
        {"summary": summarise(source), "oob": oob},
    )


def timeline_html(source: Source, *, oob: bool = True) -> str:
    return render_to_string("fleet/source.html#timeline", {"events": timeline(source), "oob": oob})


def table_html(source: Source, flt: WorkerFilter) -> tuple[str, set[int]]:
    rows = flt.apply(Worker.objects.filter(source=source))
    body = f'<tbody id="worker-rows" hx-swap-oob="true">{render_rows(rows)}</tbody>'
    return body, {w.pk for w in rows}


def row_payload(w: Worker) -> dict:
    return {
        "id": w.pk,
        "html": str(render_row(w)),
        "namespace": w.namespace,
        "state": w.state,
        "version": version_label(w.weight_version),
        "routes": list(w.routes or ()),
    }


def publish_overview() -> None:
    publish(FLEET_GROUP, EVENT_SOURCES_CHANGED, {})


def publish_refresh(source_id: int, worker_ids: list[int]) -> None:
    """After a refresh commits: the source's card, header, timeline and touched rows."""
    try:
        source = Source.objects.filter(pk=source_id).first()
        if source is None:
            return
        publish(
            FLEET_GROUP, EVENT_SOURCE_REFRESHED, {"source_id": source_id, "html": card_html(source)}
        )
        payload: dict = {"summary_html": summary_html(source)}
        if worker_ids:
            payload["timeline_html"] = timeline_html(source)
        if len(worker_ids) > LIVE_ROW_LIMIT:
            payload["resync"] = True
        elif worker_ids:
            payload["rows"] = [row_payload(w) for w in Worker.objects.filter(pk__in=worker_ids)]
        publish(source_group(source_id), EVENT_WORKERS_CHANGED, payload)
    except Exception:  # a lost push is repaired by the next resync; never fail the refresh
        logger.exception("publishing the refresh of source %s failed", source_id)
