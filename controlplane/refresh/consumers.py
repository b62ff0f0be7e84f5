"""Live refresh pages over websockets, spoken in htmx out-of-band swaps.

Consumers (each a `realtime.LiveStream`) check the session user and `Perm.VIEW` on connect and
refuse otherwise, join one group, and send a full resync from the database first: the Redis
layer may drop messages, so a (re)connecting page rebuilds itself from the journal. Progress
events then patch single cells and append to per-worker timelines.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.template.loader import render_to_string
from django.utils.html import format_html

from controlplane.fleet.models import Source
from controlplane.realtime import LiveStream
from controlplane.refresh import presenters
from controlplane.refresh.live import (
    EVENT_GATE_CHANGED,
    EVENT_PROGRESS,
    GATES_GROUP,
    REFRESHES_GROUP,
    refresh_group,
)
from controlplane.refresh.models import Gate, PolicyRefresh


class RefreshConsumer(LiveStream):
    """`ws/refreshes/<id>/`: the step list, the worker-by-step grid and call timelines."""

    async def prepare(self) -> bool:
        self.refresh_id = int(self.scope["url_route"]["kwargs"]["refresh_id"])
        self.groups_to_join = (refresh_group(self.refresh_id),)
        return await database_sync_to_async(
            PolicyRefresh.objects.filter(pk=self.refresh_id).exists
        )()

    def resync(self) -> list[str]:
        refresh = PolicyRefresh.objects.select_related("source").get(pk=self.refresh_id)
        context = presenters.detail_context(refresh) | {"oob": True}
        # State and step changes also refresh the journal table; per-call progress between
        # them only touches the grid cells and timelines (see `render`).
        return [
            render_to_string("refresh/detail.html#live", context)
            + render_to_string("refresh/detail.html#journal", context)
        ]

    def render(self, event: str, payload: dict) -> list[str]:
        if event != EVENT_PROGRESS:
            return self.resync()  # state and step changes: rebuild from the journal
        parts = []
        for cell in payload["cells"]:
            parts.append(
                render_to_string(
                    "refresh/detail.html#cell",
                    {
                        "cell": presenters.Cell(
                            cell["worker"], cell["step"], cell["status"], cell["error"], cell["ms"]
                        ),
                        "oob": True,
                    },
                )
            )
            parts.append(
                render_to_string(
                    "refresh/detail.html#timeline_append",
                    {"worker_id": cell["worker"], "calls": cell["calls"], "step": cell["step"]},
                )
            )
        parts.append(  # escaped like every other fragment
            format_html(
                '<span id="progress-count" hx-swap-oob="true">{}: {}/{}</span>',
                payload["step"],
                payload["done"],
                payload["total"],
            )
        )
        return ["".join(parts)]


class BannerConsumer(LiveStream):
    """`ws/refresh-banner/<source_id>/` (0 = every source): gates and active refreshes."""

    groups_to_join = (GATES_GROUP, REFRESHES_GROUP)

    async def prepare(self) -> bool:
        self.source_id = int(self.scope["url_route"]["kwargs"]["source_id"]) or None
        return True

    def resync(self) -> list[str]:
        source = Source.objects.filter(pk=self.source_id).first() if self.source_id else None
        context = presenters.banner_context(source) | {"oob": True}
        return [render_to_string("refresh/banner.html#banner", context)]

    def render(self, event: str, payload: dict) -> list[str]:
        if self.source_id and payload.get("source_id") not in (None, self.source_id):
            return []
        return self.resync()


class GateTableConsumer(LiveStream):
    """`ws/gate-table/`: the Gates page. A gate change swaps that gate's row; a gate not yet
    on the page (or anything unexpected) redraws the whole table body; refresh changes redraw
    the banner. Table fragments travel in frames of their own (see the fleet consumers)."""

    groups_to_join = (GATES_GROUP, REFRESHES_GROUP)

    async def prepare(self) -> bool:
        self.shown: set[int] = set()
        return True

    def resync(self) -> list[str]:
        rows = presenters.gate_rows()
        self.shown = {row.pk for row in rows}
        context = {"gate_rows": rows, "oob": True, "streamed": True}
        # Stripped: a table fragment must start with its own tag (see the fleet consumers).
        body = render_to_string("refresh/gates.html#gate-rows", context).strip()
        banner = presenters.banner_context() | {"oob": True}
        return [body, render_to_string("refresh/banner.html#banner", banner)]

    def render(self, event: str, payload: dict) -> list[str]:
        if event != EVENT_GATE_CHANGED:
            banner = presenters.banner_context() | {"oob": True}
            return [render_to_string("refresh/banner.html#banner", banner)]
        gate = (
            Gate.objects.select_related("source", "active_refresh")
            .filter(source_id=payload.get("source_id") or 0, namespace=payload.get("namespace"))
            .first()
        )
        if gate is None or gate.pk not in self.shown:
            return self.resync()[:1]
        context = {"row": presenters.gate_row(gate), "row_oob": True, "streamed": True}
        return [render_to_string("refresh/gates.html#gate-row", context).strip()]
