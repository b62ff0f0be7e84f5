"""Live events: publishing them to browser and API subscribers, and the consumer base.

Everything that pushes to websockets goes through `publish`, from sync code (services, Celery
tasks); every websocket consumer is a `LiveStream`. Delivery is best effort by design: the
Redis channel layer may drop messages, so every consumer resynchronises from the database when
it (re)connects. A publish failure is logged and never breaks the change that caused it.
"""

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer

from controlplane.accounts.roles import Perm

logger = logging.getLogger(__name__)


def publish(group: str, event: str, payload: dict[str, Any] | None = None) -> None:
    """Send one typed event to a group. Consumers receive it as `{"type": "stream.event", ...}`."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "stream.event", "event": event, "payload": payload or {}}
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:
        logger.warning("live event %s to %s was not delivered", event, group, exc_info=True)


#: Close code for a refused socket (HTTP 403 in the 4000 private range).
REFUSED = 4403


class LiveStream(AsyncWebsocketConsumer):
    """The one websocket consumer base: check who connects, join, resync, then forward.

    On connect: `authorize` (by default a signed-in session user with `Perm.VIEW`) and
    `prepare` (read the URL, say whether the stream exists), or close with `refused_code`;
    then join `groups_to_join`, accept, and send `resync()` — the Redis layer may drop
    messages, so a (re)connecting client rebuilds itself from the database. Each published
    event becomes the frames `render()` returns. A stream is one-way: what a client sends is
    ignored. `resync` and `render` run in a worker thread, so they may use the ORM.
    """

    groups_to_join: tuple[str, ...] = ()
    refused_code = REFUSED

    async def connect(self) -> None:
        if not await self.authorize() or not await self.prepare():
            await self.close(code=self.refused_code)
            return
        for group in self.groups_to_join:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self._send_frames(await database_sync_to_async(self.resync)())

    async def disconnect(self, code: int) -> None:
        for group in self.groups_to_join:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def stream_event(self, message: dict[str, Any]) -> None:
        frames = await database_sync_to_async(self.render)(
            message["event"], message.get("payload") or {}
        )
        await self._send_frames(frames)

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
