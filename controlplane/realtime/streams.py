"""`LiveStream`, the one websocket consumer base, and the per-process cache of shared renders."""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, ClassVar

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from controlplane.accounts.roles import Perm

#: Close code for a refused socket (HTTP 403 in the 4000 private range).
REFUSED = 4403

#: Shared renders kept per process: a subscriber that is behind may still ask for one a few
#: hundred events later. A miss costs a render, never a wrong frame.
SHARED_RENDERS_KEPT = 256
SHARED_RENDER_MAX_AGE_SECONDS = 30.0


class LiveStream(AsyncWebsocketConsumer):
    """The one websocket consumer base: check who connects, join, resync, then forward.

    On connect: `authorize` (by default a signed-in session user with `Perm.VIEW`) and
    `prepare` (read the URL, say whether the stream exists), or close with `refused_code`;
    then join `groups_to_join`, accept, and send `resync()` — the channel layer may drop
    messages, so a (re)connecting client rebuilds itself from the database. Each published
    event becomes the frames `render()` returns. A stream is one-way: what a client sends is
    ignored. `resync` and `render` run in a worker thread, so they may use the ORM.

    Fan-out to thousands of subscribers. Every `resync` and `render` waiting at the same
    moment in a process runs in one hop to the database thread (`_orm_hop`), not one each.
    A class whose `render` gives every subscriber the same frames for one event sets
    `shared_render = True`; each process then renders an event once for all its subscribers
    of that class (and equal `render_share_key()`), instead of once per subscriber. Such a
    `render` must neither read nor change per-subscriber state beyond what
    `render_share_key` names. A `render` that touches no database and does not block may set
    `render_uses_orm = False` to run on the event loop with no thread hop at all.
    """

    groups_to_join: tuple[str, ...] = ()
    refused_code = REFUSED
    shared_render: ClassVar[bool] = False
    render_uses_orm: ClassVar[bool] = True

    async def connect(self) -> None:
        if not await self.authorize() or not await self.prepare():
            await self.close(code=self.refused_code)
            return
        for group in self.groups_to_join:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self._send_frames(await _orm_hop(self.resync))

    async def disconnect(self, code: int) -> None:
        for group in self.groups_to_join:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels hops to the database thread before every handler to close stale
        # connections: one hop per subscriber per event, the bulk of a fan-out's cost. Events
        # reach the ORM only through `_orm_hop`, which closes stale connections itself.
        if message.get("type") == "stream.event":
            await self.stream_event(message)
        else:
            await super().dispatch(message)

    async def stream_event(self, message: dict[str, Any]) -> None:
        event, payload = message["event"], message.get("payload") or {}
        event_id = message.get("id")
        if self.shared_render and event_id is not None:
            key = (type(self), self.render_share_key(), event_id)
            frames = await _shared_frames(key, lambda: self._render(event, payload))
        else:
            frames = await self._render(event, payload)
        await self._send_frames(frames)

    async def _render(self, event: str, payload: dict[str, Any]) -> list[str]:
        if self.render_uses_orm:
            return await _orm_hop(functools.partial(self.render, event, payload))
        return self.render(event, payload)

    async def _send_frames(self, frames: list[str]) -> None:
        for frame in frames:
            if frame:
                await self.send(text_data=frame)

    async def authorize(self) -> bool:
        return await database_sync_to_async(self._session_may_view)()

    def _session_may_view(self) -> bool:
        user = self.scope.get("user")
        return bool(user and user.is_authenticated and user.has_perm(Perm.VIEW))

    async def prepare(self) -> bool:
        return True

    def resync(self) -> list[str]:
        raise NotImplementedError

    def render(self, event: str, payload: dict[str, Any]) -> list[str]:
        return self.resync()

    def render_share_key(self) -> Hashable:
        """With `shared_render`: what else, besides the event, the frames depend on (say the
        source a banner is filtered to). Subscribers with equal keys share one render."""
        return ()


# One cache per event loop: a render's future belongs to the loop that made it.
_shared: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, OrderedDict[Hashable, tuple[float, asyncio.Future[list[str]]]]
] = weakref.WeakKeyDictionary()


async def _shared_frames(key: Hashable, render: Callable[[], Awaitable[list[str]]]) -> list[str]:
    """The frames for `key`, rendered by the first subscriber to ask, awaited by the rest.

    A subscriber that disconnects while the render runs does not cancel it for the others.
    A render that raised raises for every subscriber, as it would have one by one.
    """
    cache = _shared.setdefault(asyncio.get_running_loop(), OrderedDict())
    now = time.monotonic()
    while cache and (
        len(cache) >= SHARED_RENDERS_KEPT
        or next(iter(cache.values()))[0] < now - SHARED_RENDER_MAX_AGE_SECONDS
    ):
        cache.popitem(last=False)
    entry = cache.get(key)
    if entry is None:
        entry = (now, asyncio.ensure_future(render()))
        cache[key] = entry
    return await asyncio.shield(entry[1])


class _OrmHops:
    """Calls waiting for the database thread, taken there together: one hop per batch.

    `database_sync_to_async` runs every call of a process in the same single thread anyway,
    so a batch loses no parallelism; it saves the per-call handoff (futures, a thread wake-up,
    close_old_connections twice) that, times thousands of subscribers, was the fan-out.
    """

    def __init__(self) -> None:
        self.waiting: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self.running = False
        self.task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak one

    async def run(self) -> None:
        batch: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, []
                outcomes = await database_sync_to_async(_call_each)([call for call, _ in batch])
                for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                    if future.done():  # its subscriber went away meanwhile
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
                batch = []
        finally:
            self.running = False
            for _, future in batch + self.waiting:  # cancelled mid-hop: nobody waits forever
                future.cancel()
            self.waiting = []


def _call_each(calls: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    outcomes: list[tuple[bool, Any]] = []
    for call in calls:
        try:
            outcomes.append((True, call()))
        except Exception as exc:  # raised to its own caller, not to the batch
            outcomes.append((False, exc))
    return outcomes


_hops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _OrmHops] = weakref.WeakKeyDictionary()


async def _orm_hop(call: Callable[[], Any]) -> Any:
    """`call()` in the database thread, batched with every other call waiting right now."""
    loop = asyncio.get_running_loop()
    hops = _hops.get(loop)
    if hops is None:
        hops = _hops[loop] = _OrmHops()
    future: asyncio.Future[Any] = loop.create_future()
    hops.waiting.append((call, future))
    if not hops.running:
        hops.running = True
        hops.task = loop.create_task(hops.run())
    return await future
