"""`LiveStream`, the one websocket consumer base, and batched hops to the database thread."""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.utils import await_many_dispatch

from controlplane.accounts.roles import Perm
from controlplane.realtime.dbhop import orm_hop
from controlplane.realtime.fanout import SOCKET_WRITER, Frame, Subscription, process_fanout

#: Close code for a refused socket (HTTP 403 in the 4000 private range).
REFUSED = 4403


class LiveStream(AsyncWebsocketConsumer):
    """The one websocket consumer base: check who connects, join, resync, then forward.

    On connect: `authorize` (by default a signed-in session user with `Perm.VIEW`) and
    `prepare` (read the URL, say whether the stream exists), or close with `refused_code`;
    then join `groups_to_join` through the process's fan-out (`fanout.py`), accept, and send
    `resync()` — the channel layer may drop messages, so a (re)connecting client rebuilds
    itself from the database. Each published event becomes the frames `render()` returns;
    events that arrive during the resync follow it, in order. A stream is one-way: what a
    client sends is ignored. `resync` and `render` run in a worker thread, so they may use
    the ORM.

    A consumer has no channel-layer channel of its own: the fan-out subscribes once per group
    per process and writes each event's frames to the sockets itself. Every `resync` and
    `render` waiting at the same moment in a process runs in one hop to the database thread
    (`orm_hop`). A class whose `render` gives every subscriber the same frames for one event
    sets `shared_render = True`; the fan-out then renders and encodes an event once for all
    its subscribers of that class (and equal `render_share_key()`). Such a `render` must
    neither read nor change per-subscriber state beyond what `render_share_key` names. A
    `render` that touches no database and does not block may set `render_uses_orm = False` to
    run on the event loop with no thread hop at all. A stream whose frames state versions of
    things returns them as `Versioned`: each socket then gets each version at most once and
    never an older one after a newer, counting from what its resync sent.
    """

    groups_to_join: tuple[str, ...] = ()
    refused_code = REFUSED
    shared_render: ClassVar[bool] = False
    render_uses_orm: ClassVar[bool] = True

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # As channels' consumer, minus the channel of its own (a Redis subscription per socket
        # and a task per message): events come through the fan-out instead.
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        self._subscription: Subscription | None = None
        try:
            await await_many_dispatch([receive], self.dispatch)
        except StopConsumer:
            pass
        finally:
            await self._leave()

    async def connect(self) -> None:
        if not await self.authorize() or not await self.prepare():
            await self.close(code=self.refused_code)
            return
        fanout = process_fanout()
        subscription = Subscription(self, self.scope.get(SOCKET_WRITER))
        self._subscription = subscription
        await fanout.join(subscription, self.groups_to_join)
        await self.accept()
        await self._send_frames(subscription.take(await orm_hop(self.resync), resync=True))
        # Events that came during the resync, in order; then the fan-out writes directly.
        while subscription.backlog:
            waiting, subscription.backlog = subscription.backlog, []
            for message in waiting:
                frames = await self._render(message["event"], message["payload"])
                await self._send_frames(subscription.take(frames))
        if subscription.backlog is not None:  # None: dropped or gone meanwhile
            subscription.backlog = None

    async def disconnect(self, code: int) -> None:
        await self._leave()

    async def _leave(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            await process_fanout().leave(subscription)

    async def _render(self, event: str, payload: dict[str, Any]) -> Sequence[Frame]:
        if self.render_uses_orm:
            return await orm_hop(functools.partial(self.render, event, payload))
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

    def resync(self) -> Sequence[Frame]:
        raise NotImplementedError

    def render(self, event: str, payload: dict[str, Any]) -> Sequence[Frame]:
        return self.resync()

    def render_share_key(self) -> Hashable:
        """With `shared_render`: what else, besides the event, the frames depend on (say the
        source a banner is filtered to). Subscribers with equal keys share one render."""
        return ()
