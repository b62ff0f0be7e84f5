"""Wake-ups for waiting requests: an asyncio event set when a live event reaches a group.

A long poll (`GET /api/v1/refreshes/<id>/group?wait=...`) must not hold a database connection
while it waits, nor poll the database. It waits on a `Watch` instead: the process subscribes
once per group (one channel-layer subscription however many requests wait on it, as the
fan-out does for sockets), and every event named by a watch sets that watch's flag. The waiter
then re-reads the database once: the event says *that* something moved, the database says
*what* it is now (events are best effort and may be dropped, so waiters also re-read on a
deadline of their own; see `controlplane/intake/api/waiting.py`).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


class Watch:
    """One waiter's interest in some events of one group."""

    __slots__ = ("__weakref__", "_flag", "events")

    def __init__(self, events: frozenset[str]) -> None:
        self.events = events
        self._flag = asyncio.Event()

    def notice(self, event: str) -> None:
        if not self.events or event in self.events:
            self._flag.set()

    async def wait(self, timeout: float) -> bool:
        """True once one of its events arrived (since the last wait), False after `timeout`."""
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                await self._flag.wait()
        except TimeoutError:
            return False
        self._flag.clear()
        return True


class _GroupFeed:
    """This loop's one subscription to a group, and the watches listening to it."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.watches: set[Watch] = set()
        self.channel: str | None = None
        self.reader: asyncio.Task[None] | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: Its subscription failed: the next watch of the group starts a new one.
        self.dead = False

    async def start(self, layer) -> None:
        try:
            self.channel = await layer.new_channel("wakeup.")
            await layer.group_add(self.group, self.channel)
        except BaseException as exc:
            self.dead = True
            if isinstance(exc, asyncio.CancelledError):
                self.ready.cancel()
            else:
                self.ready.set_exception(exc)
                self.ready.exception()  # retrieved: the waiters that awaited it saw it
            raise
        self.reader = asyncio.get_running_loop().create_task(self._read(layer, self.channel))
        self.ready.set_result(None)

    async def stop(self, layer) -> None:
        if self.reader is not None:
            self.reader.cancel()  # channels_redis unsubscribes a channel whose receive is cancelled
            await asyncio.gather(self.reader, return_exceptions=True)
        if self.channel is not None:
            try:
                await layer.group_discard(self.group, self.channel)
            except Exception:
                logger.debug("leaving %s failed", self.group, exc_info=True)

    async def _read(self, layer, channel: str) -> None:
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis went away: waiters fall back to their own re-reads
                logger.warning("wake-ups for %s stopped", self.group, exc_info=True)
                self.dead = True
                return
            event = str(message.get("event", ""))
            for watch in list(self.watches):
                watch.notice(event)


class Wakeups:
    """The wake-up subscriptions of one event loop (a server process has one)."""

    def __init__(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            raise RuntimeError("wake-ups need a channel layer")
        self.layer = layer
        self.feeds: dict[str, _GroupFeed] = {}

    @asynccontextmanager
    async def watch(self, group: str, events: frozenset[str] = frozenset()) -> AsyncIterator[Watch]:
        """A `Watch` on `group`, subscribed once this returns (so a change made after it is
        seen). `events` empty: every event wakes it."""
        watch = Watch(events)
        feed = self.feeds.get(group)
        if feed is None or feed.dead:
            feed = self.feeds[group] = _GroupFeed(group)
            feed.watches.add(watch)
            try:
                await feed.start(self.layer)
            except BaseException:
                feed.watches.discard(watch)
                if self.feeds.get(group) is feed:
                    del self.feeds[group]
                raise
        else:
            feed.watches.add(watch)
            try:
                await asyncio.shield(feed.ready)
            except asyncio.CancelledError:
                feed.watches.discard(watch)
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # The watch that was subscribing was cancelled, not this one: no wake-ups.
                raise ConnectionError(f"the subscription to {group} was abandoned") from None
            except BaseException:
                feed.watches.discard(watch)
                raise
        try:
            yield watch
        finally:
            feed.watches.discard(watch)
            if not feed.watches:
                if self.feeds.get(group) is feed:
                    del self.feeds[group]
                await feed.stop(self.layer)


_wakeups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Wakeups] = (
    weakref.WeakKeyDictionary()
)


def process_wakeups() -> Wakeups:
    """The wake-ups of the running event loop, made on first use."""
    loop = asyncio.get_running_loop()
    wakeups = _wakeups.get(loop)
    if wakeups is None:
        wakeups = _wakeups[loop] = Wakeups()
    return wakeups
