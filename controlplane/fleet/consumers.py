"""Websocket streams for the fleet pages, spoken in htmx out-of-band swaps.

Each consumer (a `realtime.LiveStream`) checks the session user and `Perm.VIEW` on connect and
refuses otherwise, joins one group, and sends a full resync from the database first — the Redis
layer may drop messages, so a (re)connecting page never trusts what it missed.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.http import QueryDict
from django.utils.html import format_html

from controlplane.fleet import live
from controlplane.fleet.filters import WorkerFilter, paginate
from controlplane.fleet.models import Source
from controlplane.realtime import LiveStream


class FleetOverviewConsumer(LiveStream):
    # Every viewer sees the same overview: one render per event per process.
    groups_to_join = (live.FLEET_GROUP,)
    shared_render = True

    def resync(self) -> list[str]:
        return [live.overview_html() + live.overview_charts_html()]

    def render(self, event: str, payload: dict) -> list[str]:
        if event == live.EVENT_CHARTS_CHANGED:
            return [live.shared_overview_charts_html(payload.get("stamp", ""))]
        if event == live.EVENT_DISCOVERY_FINISHED:
            return [live.shared_source_html("card", payload["source_id"], payload.get("stamp", ""))]
        return [live.overview_html()]


class SourceStreamConsumer(LiveStream):
    """One page of one source's worker table, filtered like the page that opened it.

    Design: the publisher renders each changed row once for everybody (`live.row_payload`),
    and this process renders the summary, timeline and charts once for its subscribers;
    this consumer forwards only the rows its client shows. It knows the page it shows (the
    ids of `shown`, from its own resync of the same query string as the page), so a row on
    another page or outside the filter costs one set lookup and one predicate here, and
    nothing on the wire. We chose this over broadcasting every row as an out-of-band swap
    that htmx ignores when the id is not in the DOM: with 2,000 workers that would ship the
    whole table to every subscriber and make every browser parse it, which is the cost paging
    removes. A row that newly matches the view is appended when the database puts it on the
    client's page (the last page; sort order is restored on the next read); a row that
    belongs to another page brings a one-line notice to re-read the page instead.
    """

    async def prepare(self) -> bool:
        self.source_id = int(self.scope["url_route"]["kwargs"]["source_id"])
        self.filter = WorkerFilter.from_query(
            QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        )
        self.shown: set[int] = set()
        self.is_last_page = True
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
        return [
            live.summary_html(source)
            + live.timeline_html(source)
            + live.source_charts_html(source, with_map=False)
            + self._notice(""),
            self._take(live.table_html(source, self.filter)),
        ]

    def _take(self, table: live.PageTable) -> str:
        self.shown, self.is_last_page = set(table.shown), table.is_last
        return table.html

    def render(self, event: str, payload: dict) -> list[str]:
        if event == live.EVENT_SUMMARY_CHANGED:
            # A gate or policy refresh change: rendered here, once per process for every
            # subscriber of this source.
            return [live.shared_source_html("summary", self.source_id, payload.get("stamp", ""))]
        # A discovery run: announced by id and stamp, rendered here once per process.
        stamp = payload.get("stamp", "")
        head = live.shared_source_html("summary", self.source_id, stamp)
        if payload.get("workers_moved"):
            head += live.shared_source_html("timeline", self.source_id, stamp)
            head += live.shared_source_html("charts", self.source_id, stamp)
        if payload.get("resync"):
            table = live.shared_table_html(self.source_id, self.filter.query, stamp)
            return [head + self._notice(""), self._take(table)]
        replaced: list[str] = []
        arrivals: list[dict] = []
        for row in payload.get("rows", ()):
            self._row(row, replaced, arrivals)
        appended, elsewhere = self._place(arrivals)
        if elsewhere:
            head += self._notice(
                "Workers matching this view joined or changed on other pages. Reload the page "
                "to see them in order."
            )
        frames = [head]
        if replaced:
            frames.append("".join(replaced))
        if appended:
            frames.append(
                f'<tbody hx-swap-oob="beforeend:#worker-rows">{"".join(appended)}</tbody>'
            )
        return frames

    def _row(self, row: dict, replaced: list[str], arrivals: list[dict]) -> None:
        """Swap or delete a row this page shows; keep a newly matching one for `_place`."""
        pk = row["id"]
        if not self.filter.matches(row):
            if pk in self.shown:
                self.shown.discard(pk)
                replaced.append(f'<tr id="worker-{pk}" hx-swap-oob="delete"></tr>')
        elif pk in self.shown:
            replaced.append(row["html"].replace("<tr ", '<tr hx-swap-oob="true" ', 1))
        else:
            arrivals.append(row)

    def _place(self, arrivals: list[dict]) -> tuple[list[str], bool]:
        """Rows that match the view but are not shown: those the database now puts on this
        page join it (only the last page can gain rows without pushing others out); the rest
        belong to other pages. One query, and only when such a row arrives at a last page."""
        if not arrivals:
            return [], False
        if not self.is_last_page:
            return [], True
        page = paginate(
            self.filter.queryset(self.source_id).values_list("pk", flat=True), self.filter.page
        )
        here = set(page.object_list)
        appended = [row["html"] for row in arrivals if row["id"] in here]
        self.shown |= {row["id"] for row in arrivals if row["id"] in here}
        return appended, len(appended) < len(arrivals)

    def _notice(self, text: str) -> str:
        if not text:
            return '<p id="workers-notice" class="notice" role="status" hx-swap-oob="true"></p>'
        return format_html(
            '<p id="workers-notice" class="notice" role="status" hx-swap-oob="true">{} '
            '<a href="?{}">Reload</a></p>',
            text,
            self.filter.query,
        )
