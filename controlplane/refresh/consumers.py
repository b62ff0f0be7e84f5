"""Live refresh pages over websockets, spoken in htmx out-of-band swaps.

Consumers (each a `realtime.LiveStream`) check the session user and `Perm.VIEW` on connect and
refuse otherwise, join one group, and send a full resync from the database first: the Redis
layer may drop messages, so a (re)connecting page rebuilds itself from the journal (only the
part it shows, and only when something happened since it was drawn). Progress events then patch
single cells and append to per-worker timelines.
"""

from __future__ import annotations

from collections.abc import Hashable

from channels.db import database_sync_to_async
from django.http import QueryDict
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.utils.html import format_html

from controlplane.fleet.models import Source
from controlplane.realtime import LiveStream
from controlplane.refresh import presenters
from controlplane.refresh.gridrows import Cell, render_cells, render_grid
from controlplane.refresh.live import (
    EVENT_GATE_CHANGED,
    EVENT_PROGRESS,
    GATES_GROUP,
    REFRESHES_GROUP,
    refresh_group,
)
from controlplane.refresh.models import Gate, JournalEntry, PolicyRefresh
from controlplane.refresh.step_order import WORKER_STEPS


def _mark(query: QueryDict, name: str) -> int | None:
    value = query.get(name)
    return int(value) if isinstance(value, str) and value.isdecimal() else None


class RefreshConsumer(LiveStream):
    """`ws/refreshes/<id>/?<grid page>&seen_…`: the refresh's head (state, steps, gates, held
    reason), the grid cells of the page the client shows, and new journal calls.

    What travels is what changed on that page, never a whole table: per-call progress patches
    the cells and timelines of workers on the client's page (a finished worker elsewhere costs
    a set lookup here, nothing on the wire); a state or step change sends the small head, the
    cells of the page whose status moved (diffed against what this stream last sent), and the
    journal calls newer than the newest the client has. The page tells the stream what it
    already holds (`seen_state`, `seen_journal`, `seen_results`: both tables are append-only),
    so a (re)connect resends the page's grid and calls only when something happened since.
    """

    async def prepare(self) -> bool:
        self.refresh_id = int(self.scope["url_route"]["kwargs"]["refresh_id"])
        query = QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        self.view = presenters.GridFilter.from_query(query)
        journal = _mark(query, "seen_journal")
        #: What the client's page holds (`presenters.seen_marks`); `None` marks: a bare client.
        self.client_marks: dict[str, object] = {
            "state": query.get("seen_state"),
            "journal": journal,
            "results": _mark(query, "seen_results"),
        }
        self.journal_top: int = journal or 0
        self.page_ids: set[int] = set()
        #: Each cell of the client's page → the status this stream last gave it.
        self.sent: dict[str, str] = {}
        self.groups_to_join = (refresh_group(self.refresh_id),)
        return await database_sync_to_async(
            PolicyRefresh.objects.filter(pk=self.refresh_id).exists
        )()

    def _load(self) -> PolicyRefresh:
        return PolicyRefresh.objects.select_related("source").get(pk=self.refresh_id)

    def _head(self, refresh: PolicyRefresh) -> str:
        context = presenters.head_context(refresh) | {"oob": True}
        return render_to_string("refresh/detail.html#live", context)

    # Table fragments travel in frames of their own, each starting with its own tag (see the
    # fleet consumers): htmx drops table tags that follow other elements in one message.

    def resync(self) -> list[str]:
        refresh = self._load()
        page = self.view.page_of(refresh)
        workers = list(page.object_list)
        self.page_ids = {w.pk for w in workers}
        marks = presenters.seen_marks(refresh)
        head = self._head(refresh)
        if marks == self.client_marks:
            # The page the client loaded is current: remember its cells, send the head only.
            self._remember(presenters.cells_of(refresh, self.page_ids))
            return [head]
        rows = presenters.grid(refresh, workers)
        self._remember({row.worker.pk: row.cells for row in rows})
        context = {
            "grid_html": render_grid(rows, len(WORKER_STEPS) + 2),
            "rows_oob": True,  # the tbody swaps; its cells travel inside it, not on their own
        }
        frames = [head, render_to_string("refresh/detail.html#grid-rows", context).strip()]
        if self.client_marks["journal"] is None:  # a bare client: the whole journal card
            journal = list(presenters.latest_journal(refresh))
            self.journal_top = journal[0].pk if journal else 0
            frames[0] += render_to_string(
                "refresh/detail.html#journal", {"journal": journal, "oob": True}
            )
        else:
            frames += self._new_calls(refresh)
        self.client_marks = marks
        return frames

    def _remember(self, cells: dict[int, list[Cell]]) -> None:
        self.sent = {c.dom_id: c.status for row in cells.values() for c in row}

    def _new_calls(self, refresh: PolicyRefresh) -> list[str]:
        """Journal calls newer than the client's newest, prepended to its table."""
        calls = list(presenters.latest_journal(refresh, after=self.journal_top))
        if not calls:
            return []
        self.journal_top = calls[0].pk
        rows = render_to_string(
            "refresh/detail.html#journal-rows", {"journal": calls, "prepend": True}
        ).strip()
        # The live journal's "N calls" follows (a filtered view's count is `journal-count-view`
        # and stays), and "No calls yet." hides: it stays in the page, so every batch finds it.
        total = JournalEntry.objects.filter(refresh=refresh).count()
        count = (
            f'<span class="muted" id="journal-count" hx-swap-oob="true">'
            f"{total} call{pluralize(total)}</span>"
        )
        return [rows, '<p class="empty" id="journal-empty" hidden hx-swap-oob="true"></p>', count]

    def render(self, event: str, payload: dict) -> list[str]:
        if event == EVENT_PROGRESS:
            return self._progress(payload)
        # State and step changes: the head, the page's cells that moved, the new calls.
        refresh = self._load()
        frames = [self._head(refresh)]
        changed = [
            c
            for row in presenters.cells_of(refresh, self.page_ids).values()
            for c in row
            if self.sent.get(c.dom_id) != c.status
        ]
        if changed:
            frames.append(self._cells(changed))
        return frames + self._new_calls(refresh)

    def _cells(self, cells: list[Cell]) -> str:
        for cell in cells:
            self.sent[cell.dom_id] = cell.status
        return render_cells(cells, oob=True)

    def _progress(self, payload: dict) -> list[str]:
        parts = []
        for cell in payload["cells"]:
            if cell["worker"] not in self.page_ids:
                continue  # a worker on another page of the grid
            parts.append(
                self._cells(
                    [Cell(cell["worker"], cell["step"], cell["status"], cell["error"], cell["ms"])]
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
    # The banner depends on the event and the source only: one render per source per event.
    shared_render = True

    async def prepare(self) -> bool:
        self.source_id = int(self.scope["url_route"]["kwargs"]["source_id"]) or None
        return True

    def render_share_key(self) -> Hashable:
        return self.source_id

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
