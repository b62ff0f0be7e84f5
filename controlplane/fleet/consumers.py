"""Websocket streams for the fleet pages, spoken in htmx out-of-band swaps.

Each consumer (a `realtime.LiveStream`) checks the session user and `Perm.VIEW` on connect and
refuses otherwise, joins one group, and sends a full resync from the database first — the Redis
layer may drop messages, so a (re)connecting page never trusts what it missed.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.http import QueryDict

from controlplane.fleet import live
from controlplane.fleet.filters import WorkerFilter
from controlplane.fleet.models import Source
from controlplane.realtime import LiveStream


class FleetOverviewConsumer(LiveStream):
    groups_to_join = (live.FLEET_GROUP,)

    def resync(self) -> list[str]:
        return [live.overview_html()]

    def render(self, event: str, payload: dict) -> list[str]:
        if event == live.EVENT_SOURCE_REFRESHED:
            return [payload["html"]]
        return [live.overview_html()]


class SourceStreamConsumer(LiveStream):
    """The worker table of one source, filtered like the page that opened it."""

    async def prepare(self) -> bool:
        self.source_id = int(self.scope["url_route"]["kwargs"]["source_id"])
        self.filter = WorkerFilter.from_query(
            QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        )
        self.shown: set[int] = set()
        self.groups_to_join = (live.source_group(self.source_id),)
        return await database_sync_to_async(Source.objects.filter(pk=self.source_id).exists)()

    def _source(self) -> Source | None:
        return Source.objects.filter(pk=self.source_id).first()

    # Table fragments travel in frames of their own: htmx parses a message in a <template>,
    # where <tr>/<tbody> are only table content when they come first; after a <section> the
    # parser would drop the table tags and keep their cells as loose elements.

    def resync(self) -> list[str]:
        source = self._source()
        if source is None:
            return []
        table, self.shown = live.table_html(source, self.filter)
        return [live.summary_html(source) + live.timeline_html(source), table]

    def render(self, event: str, payload: dict) -> list[str]:
        if payload.get("resync"):
            return self.resync()
        replaced: list[str] = []
        appended: list[str] = []
        for row in payload.get("rows", ()):
            self._row(row, replaced, appended)
        frames = [payload.get("summary_html", "") + payload.get("timeline_html", "")]
        if replaced:
            frames.append("".join(replaced))
        if appended:
            frames.append(
                f'<tbody hx-swap-oob="beforeend:#worker-rows">{"".join(appended)}</tbody>'
            )
        return frames

    def _row(self, row: dict, replaced: list[str], appended: list[str]) -> None:
        flt, pk = self.filter, row["id"]
        wanted = (
            (not flt.namespace or row["namespace"] == flt.namespace)
            and (not flt.state or row["state"] == flt.state)
            and (not flt.version or row["version"] == flt.version)
            and (not flt.route or flt.route in row["routes"])
        )
        if not wanted:
            if pk in self.shown:
                self.shown.discard(pk)
                replaced.append(f'<tr id="worker-{pk}" hx-swap-oob="delete"></tr>')
        elif pk in self.shown:
            replaced.append(row["html"].replace("<tr ", '<tr hx-swap-oob="true" ', 1))
        else:
            self.shown.add(pk)
            appended.append(row["html"])
