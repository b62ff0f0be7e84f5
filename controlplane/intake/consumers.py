"""`ws/gates/`: a push stream of gate changes for rollout frameworks.

Auth on connect: a bearer token in the `Authorization` header, or the browser session. On
connect the current state of every visible gate is sent first, since the Redis channel layer
may drop messages and a reconnecting client must resync from the database.
Optional `?source=<name>` narrows the stream to one source.

A push is a wake-up, not the answer. What a stream sends for a changed gate is its row as
committed when the frame is rendered, never the payload the writer published: pushes from
different processes can arrive out of order (a publisher holds frames while Redis is away and
sends them when it returns), so a late "open" must not follow the close that replaced it. And
a push can be lost (Redis down or flushed, or a writer publishing to another Redis): each
process with gate streams reads every gate's revision every `WATCH_SECONDS` and sends the
gates that moved and were still not rendered one read later, their push lost. What the streams
have is what their snapshots showed, not what the watch first read (`_Shown`). Why:
docs/decisions/2026-12-04-gate-copies-validated.md.

A stream gets each gate revision once, and never an older one after a newer: the frames are
`Versioned` by revision, so a wake-up for a revision the stream already has — the watch sent
it and then its push arrived, or the snapshot showed it — sends nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import weakref
from collections.abc import Hashable, Iterable
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.db import DatabaseError

from controlplane.accounts import tokens
from controlplane.accounts.roles import Perm
from controlplane.fleet.models import Source
from controlplane.realtime import LiveStream, Versioned
from controlplane.realtime.fanout import process_fanout
from controlplane.refresh.gate_lags import with_lags
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.live import EVENT_GATE_CHANGED, GATES_GROUP
from controlplane.refresh.models import Gate
from controlplane.refresh.policy_lag import with_lag

logger = logging.getLogger(__name__)

#: Close code for a refused socket: no acceptable bearer token or session (HTTP 401).
UNAUTHORIZED = 4401
#: How often a process with gate streams looks for gate changes whose push never reached it.
WATCH_SECONDS = 2.0

#: Gate id → the newest revision a stream of this process has rendered (any thread).
_rendered: dict[int, int] = {}


class _Shown:
    """What the snapshots since the watch's last read showed, merged: per gate the oldest
    revision any of them sent, and the newest gate any unfiltered one could have sent (a
    filtered snapshot says nothing about the gates it was not asked for: counting those as
    never sent would resend every other source's gate at each such connect).

    The watch's first read of the revisions is not what the streams have: a gate can change
    between a stream's snapshot and that read (both run in threads, in either order), and if
    its push is lost the watch would count the change as seen. So the watch lowers what it
    counts as sent to what the snapshots showed, and counts a gate newer than any snapshot as
    never sent; a stream that already has a revision it is sent again drops it (`Versioned`).
    Merged as they arrive, so a burst of connects costs the watch one pass over the gates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._oldest: dict[int, int] = {}
        self._newest_gate: int | None = None

    def add(self, revisions: tuple[tuple[int, int], ...], *, every_gate: bool) -> None:
        """Record a snapshot; `every_gate`: it was asked for every gate (no filter)."""
        newest = max((pk for pk, _ in revisions), default=0)
        with self._lock:
            for pk, revision in revisions:
                self._oldest[pk] = min(self._oldest.get(pk, revision), revision)
            if every_gate and (self._newest_gate is None or newest < self._newest_gate):
                self._newest_gate = newest

    def lower(self, accounted: dict[int, int], gate_ids: Iterable[int]) -> None:
        """Lower `accounted` (gate id → revision the streams have) to what was shown, and
        forget the snapshots: the next read's comparison covers everything after them."""
        with self._lock:
            oldest, newest = self._oldest, self._newest_gate
            self._oldest, self._newest_gate = {}, None
        if not oldest and newest is None:
            return
        for pk in gate_ids:
            if pk in oldest:
                accounted[pk] = min(accounted.get(pk, 0), oldest[pk])
            elif newest is not None and pk > newest:
                accounted[pk] = 0


_shown = _Shown()


def _principal(scope) -> tuple[Any, set[int] | None] | None:
    """(user, allowed source ids or None), or None when nobody acceptable is connecting."""
    headers = dict(scope.get("headers") or [])
    raw = headers.get(b"authorization", b"").decode("latin-1")
    if raw:
        kind, _, secret = raw.partition(" ")
        token = tokens.authenticate(secret.strip()) if kind.lower() == "bearer" else None
        if token is None:
            return None
        user, limit = token.user, tokens.allowed_source_ids(token)
    else:
        user, limit = scope.get("user"), None
        if user is None or not user.is_authenticated:
            return None
    if not user.has_perm(Perm.VIEW):
        return None
    return user, limit


class GateStreamConsumer(LiveStream):
    groups_to_join = (GATES_GROUP,)
    refused_code = UNAUTHORIZED
    # `render` is a filter and one row read, equal for equal filters, so the fan-out renders it
    # once per event for every stream with the same token scope and source.
    shared_render = True

    async def authorize(self) -> bool:
        principal = await database_sync_to_async(_principal)(self.scope)
        if principal is None:
            return False
        _, self.limit = principal
        return True

    async def prepare(self) -> bool:
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.source_name = (query.get("source") or [""])[0]
        self.allowed_names = None
        if self.limit is not None:
            self.allowed_names = await database_sync_to_async(self._source_names)()
        # Asked for every subscriber on every event: made once here.
        names = None if self.allowed_names is None else frozenset(self.allowed_names)
        self.share_key = (names, self.source_name)
        return True

    async def connect(self) -> None:
        await super().connect()
        # Once subscribed and sent its snapshot: a watch that found no subscriber while this
        # stream was joining has ended, and must start again.
        if self._subscription is not None:
            _watch_in_this_process()

    def _source_names(self) -> set[str]:
        return set(Source.objects.filter(pk__in=self.limit).values_list("name", flat=True))

    def resync(self) -> list[Versioned]:
        query = Gate.objects.select_related("source").order_by("source__name", "namespace")
        if self.limit is not None:
            query = query.filter(source_id__in=self.limit)
        if self.source_name:
            query = query.filter(source__name=self.source_name)
        gates = list(query)
        # The lags in one batch: a few reads per source, not per gate, for every connect.
        snapshot = [_public(gate) for gate in with_lags(gates)]
        text = json.dumps({"event": "gates.snapshot", "gates": snapshot})
        revisions = tuple((g.pk, g.revision) for g in gates)
        _shown.add(revisions, every_gate=self.limit is None and not self.source_name)
        return [Versioned(text, revisions)]

    def render_share_key(self) -> Hashable:
        return self.share_key

    def render(self, event: str, payload: dict[str, Any]) -> list[Versioned]:
        source = payload.get("source")
        if self.allowed_names is not None and source not in self.allowed_names:
            return []
        if self.source_name and source != self.source_name:
            return []
        # The row as committed now, whatever the push carried (it may be older).
        source_id, namespace = payload.get("source_id"), payload.get("namespace")
        if not isinstance(source_id, int) or not isinstance(namespace, str):
            return []
        gate = (
            Gate.objects.select_related("source")
            .filter(source_id=source_id, namespace=namespace)
            .first()
        )
        if gate is None:
            return []
        _rendered[gate.pk] = max(_rendered.get(gate.pk, 0), gate.revision)
        gate_now = _public(with_lag(serialize_gate(gate), gate.source))
        return [
            Versioned(json.dumps({"event": event, "gate": gate_now}), ((gate.pk, gate.revision),))
        ]


def _public(gate: dict[str, Any]) -> dict[str, Any]:
    """A gate as the stream sends it: the gate API's fields (the copy's mark stays inside)."""
    gate.pop("policy_mark", None)
    return gate


_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
    weakref.WeakKeyDictionary()
)


def _watch_in_this_process() -> None:
    loop = asyncio.get_running_loop()
    task = _watchers.get(loop)
    if task is None or task.done():
        _watchers[loop] = loop.create_task(_watch())


def _revisions() -> dict[int, tuple[int, dict[str, Any]]]:
    rows = Gate.objects.values_list("pk", "revision", "source_id", "source__name", "namespace")
    return {
        pk: (revision, {"source_id": source_id, "source": name, "namespace": namespace})
        for pk, revision, source_id, name, namespace in rows
    }


async def _watch() -> None:
    """Send the gates that changed without a push reaching this process; ends when the
    process has no gate stream left (the next one to connect starts it again).

    A revision is sent when it was already there one read ago and still no stream of this
    process has rendered it: its push gets a whole `WATCH_SECONDS` to arrive, since a push is
    usually on its way when the watch first sees a change, and a watch that sent it at once
    would make every such change render twice (the stream would still get it once)."""
    accounted: dict[int, int] | None = None  # pk -> revision the streams have or were sent
    waiting: dict[int, int] = {}  # pk -> revision seen at the last read and not yet rendered
    first = True
    while True:
        feed = process_fanout().feeds.get(GATES_GROUP)
        if not first and (feed is None or not feed.subscribers):
            return
        first = False
        # Copied before the read, so every revision in it was committed before the read saw
        # its row (see `_forget_other_rows`).
        remembered = dict(_rendered)
        try:
            rows = await database_sync_to_async(_revisions)()
        except DatabaseError:
            logger.warning("gate revisions unreadable; gate streams wait for pushes", exc_info=True)
            rows = None
        if rows is not None:
            _forget_other_rows(rows, remembered)
        if rows is not None and accounted is None:
            # The baseline: what the first read found, lowered to what the snapshots showed.
            accounted = {pk: revision for pk, (revision, _) in rows.items()}
            _shown.lower(accounted, rows)
        elif rows is not None and accounted is not None and feed is not None:
            _shown.lower(accounted, rows)
            late: list[dict[str, Any]] = []
            still: dict[int, int] = {}
            for pk, (revision, scope) in rows.items():
                done = max(accounted.get(pk, 0), _rendered.get(pk, 0))
                if revision <= done:
                    continue
                if waiting.get(pk, 0) > done:  # unrendered for a whole read: its push is lost
                    late.append(scope)
                    accounted[pk] = revision
                else:
                    still[pk] = revision
            waiting = still
            for scope in late:
                message = {"type": "stream.event", "event": EVENT_GATE_CHANGED}
                # In turn with the pushes: never overtaking one, nor overtaken.
                await feed.deliver({**message, "payload": scope})
        await _until_next_read()


def _forget_other_rows(
    rows: dict[int, tuple[int, dict[str, Any]]], remembered: dict[int, int]
) -> None:
    """Forget a render recorded for a gate id whose row is now at a lower revision.

    A row's revision only grows, so a rendered revision above the row's present one was
    another row's that had the same id (a row deleted and its id given again, as a database
    whose sequences were reset does). Counted, it would hide every change of the new row up
    to that revision from streams that connect later: their snapshots lower what the watch
    counts as sent (`_Shown`), but not `_rendered`. `remembered` was copied from `_rendered`
    before `rows` was read, so a render of the row that was read cannot exceed it; a render
    made since the copy may be dropped with the stale entry, which costs at most a revision
    sent again, and a stream drops a revision it already has (`Versioned`).

    (A stream connected across such a reuse keeps the old row's revision itself and drops the
    new row's lower ones: an out-of-order render looks the same to it, and it cannot ask.)"""
    for pk, (revision, _) in rows.items():
        if remembered.get(pk, 0) > revision:
            _rendered.pop(pk, None)


async def _until_next_read() -> None:
    await asyncio.sleep(WATCH_SECONDS)
