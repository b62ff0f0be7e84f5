"""Websocket streams for the fleet pages, spoken in htmx out-of-band swaps.

Each consumer checks the session user and `Perm.VIEW` on connect and refuses otherwise, joins
one group, and sends a full resync from the database first — the Redis layer may drop
messages, so a (re)connecting page never trusts what it missed.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import QueryDict

from controlplane.accounts.roles import Perm
from controlplane.fleet import live
from controlplane.fleet.filters import WorkerFilter
from controlplane.fleet.models import Source

#: Close code for a refused socket (HTTP 403 in the 4000 private range).
REFUSED = 4403


class _FleetStream(AsyncWebsocketConsumer):
    group = ""

    @database_sync_to_async
    def _allowed(self) -> bool:
        user = self.scope.get("user")
        return bool(user and user.is_authenticated and user.has_perm(Perm.VIEW))

    async def connect(self) -> None:
        if not await self._allowed() or not await self.prepare():
            await self.close(code=REFUSED)
            return
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        for frame in await database_sync_to_async(self.resync)():
            await self.send(text_data=frame)

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def stream_event(self, message: dict) -> None:
        frames = await database_sync_to_async(self.render)(message["event"], message["payload"])
        for frame in frames:
            if frame:
                await self.send(text_data=frame)

    async def prepare(self) -> bool:
        return True

    def resync(self) -> list[str]:
        raise NotImplementedError

    def render(self, event: str, payload: dict) -> list[str]:
        raise NotImplementedError


class FleetOverviewConsumer(_FleetStream):
    group = live.FLEET_GROUP

    def resync(self) -> list[str]:
        return [live.overview_html()]

    def render(self, event: str, payload: dict) -> list[str]:
        if event == live.EVENT_SOURCE_REFRESHED:
            return [payload["html"]]
        return [live.overview_html()]


class SourceStreamConsumer(_FleetStream):
    """The worker table of one source, filtered like the page that opened it."""

    async def prepare(self) -> bool:
        self.source_id = int(self.scope["url_route"]["kwargs"]["source_id"])
        self.filter = WorkerFilter.from_query(
            QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        )
        self.shown: set[int] = set()
        self.group = live.source_group(self.source_id)
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
