"""Process-level fan-out: one channel-layer subscription per stream, frames written to sockets.

Channels gives every consumer a channel of its own and dispatches every group message to every
consumer as a task of its own (receive, `asyncio.wait`, handler, then the ASGI send through the
session middleware and the server's framing): at 2,000 subscribers and 4 events a second that
was most of a core. Here each process subscribes once per group (`Feed`), and on each event:

- renders once per *render unit*: all subscribers of one `shared_render` class with equal
  `render_share_key()` share one render (the fleet overview, banners filtered to one source,
  gate streams narrowed to the same sources); any other subscriber is a unit of its own, so
  per-subscriber filtering (the page a client shows) stays what its `render` says;
- encodes the unit's frames once (`encode_text`) and writes the bytes to each socket of the
  unit directly (`SocketWriter`), with no task, await or ASGI message per subscriber.

Authorization is unchanged: a `LiveStream` joins only after `authorize` and `prepare` said yes,
and per-source filtering lives in its `render` or `render_share_key`, which the fan-out
honours. Ordering per stream: a feed handles its events one after the other (`Feed.lock`, which
anything else delivering to a feed takes too), a socket's frames go out in that order, and a
subscriber that is still resyncing keeps the events that arrive meanwhile
(`Subscription.backlog`) for after its resync. A render that states versions (`Versioned`, the
gate stream's revisions) is sent to each socket only if it is newer than what that socket has
had, from its resync on: a wake-up that comes twice, or after the resync showed its change,
sends nothing. Between two groups a socket joined
(gates and refreshes) order is not kept: each group's feed runs on its own. The streams that
join two groups draw independent parts of the page from each (gate rows, the banner), and the
banner is read from the database at each render, so a late frame never carries stale state
past a newer read of the same part.

Backpressure: a client that does not read (its socket's unsent bytes pass
`SLOW_CLIENT_BUFFER_BYTES`, or a send through the ASGI fallback takes over
`SLOW_SEND_SECONDS`) is dropped — its connection aborted — rather than stalling the others
or buffering without bound. We chose dropping over coalescing into a resync: a page's
websocket reconnects by itself and resyncs from the database on connect, which is the resync,
with no per-client timers or state in the fan-out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol

from channels.layers import get_channel_layer

from controlplane.realtime.dbhop import call_each, orm_hop

logger = logging.getLogger(__name__)

#: Unsent bytes past which a client counts as not reading (a fleet card is a few KB; this is
#: minutes of events for a page, far past what a reading browser ever holds).
SLOW_CLIENT_BUFFER_BYTES = 1 << 20
#: A send through the ASGI fallback (servers we cannot write to directly) taking longer.
SLOW_SEND_SECONDS = 2.0
#: Events kept for a subscriber still resyncing; past this it is dropped (it reconnects).
BACKLOG_LIMIT = 1000
#: Close code sent to a dropped client where the connection can still carry one.
TRY_AGAIN_LATER = 1013

#: Scope key of the connection's `SocketWriter` (or None), set by `with_socket_writers`.
SOCKET_WRITER = "controlplane.socket_writer"

# -- frames ----------------------------------------------------------------------------------


class Versioned(NamedTuple):
    """A frame stating the versions of things (a gate at a revision): a socket gets a version of
    a thing at most once, and never an older one after a newer. Pushes are wake-ups that can
    arrive twice or late (a change seen by a watch and then announced, a resync that already
    showed it), so a render can find what a socket has had: this is where it is dropped."""

    text: str
    #: (thing, version) pairs; versions of one thing only ever grow.
    versions: tuple[tuple[Hashable, int], ...]


#: What `resync` and `render` return: plain text frames, or `Versioned` ones.
Frame = str | Versioned


def text_of(frame: Frame) -> str:
    return frame.text if isinstance(frame, Versioned) else frame


# -- writing to a socket ---------------------------------------------------------------------


def encode_text(frames: list[str]) -> bytes:
    """Websocket text frames, server to client (unmasked, FIN set), concatenated."""
    out = bytearray()
    for frame in frames:
        if not frame:
            continue
        data = frame.encode()
        size = len(data)
        out.append(0x81)
        if size < 126:
            out.append(size)
        elif size < 1 << 16:
            out.append(126)
            out += size.to_bytes(2, "big")
        else:
            out.append(127)
            out += size.to_bytes(8, "big")
        out += data
    return bytes(out)


class SocketWriter:
    """Writes pre-encoded frames straight to one connection of uvicorn's websockets-sansio
    protocol (uvicorn's default, what production runs), past the ASGI send.

    Safe alongside the protocol: uvicorn writes whole frames (pong, close) with one
    `transport.write`, so frames never interleave; what we write is uncompressed (RSV1 unset),
    which RFC 7692 allows on a connection that negotiated permessage-deflate, and which leaves
    the compression contexts of both ends untouched.
    """

    __slots__ = ("_protocol",)

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol

    @classmethod
    def for_send(cls, send: Callable[..., Any]) -> SocketWriter | None:
        """A writer when `send` is uvicorn's websockets-sansio protocol, else None."""
        protocol = getattr(send, "__self__", None)
        if protocol is None or type(protocol).__name__ != "WebSocketsSansIOProtocol":
            return None
        if not all(hasattr(protocol, name) for name in ("transport", "conn", "close_sent")):
            return None  # a uvicorn we do not know: the ASGI path is always right
        return cls(protocol)

    @property
    def open(self) -> bool:
        protocol = self._protocol
        transport = protocol.transport
        return (
            transport is not None
            and not transport.is_closing()
            and not protocol.close_sent
            and protocol.conn.state.name == "OPEN"
        )

    def buffered(self) -> int:
        return self._protocol.transport.get_write_buffer_size()

    def write(self, data: bytes) -> None:
        self._protocol.transport.write(data)

    def abort(self) -> None:
        """Drop the connection now: the client reconnects; uvicorn tells the consumer."""
        self._protocol.transport.abort()


def with_socket_writers(app: Any) -> Any:
    """ASGI middleware, outermost on websockets: gives the connection's consumer a writer to
    its socket (`scope[SOCKET_WRITER]`) when the server is one we can write to directly.
    Only the server's own `send` knows its socket; middlewares inside wrap it."""

    async def middleware(scope: Any, receive: Any, send: Any) -> Any:
        if scope.get("type") == "websocket":
            scope = dict(scope, **{SOCKET_WRITER: SocketWriter.for_send(send)})
        return await app(scope, receive, send)

    return middleware


# -- subscribers and feeds -------------------------------------------------------------------


class Subscriber(Protocol):
    """What the fan-out calls on a subscriber (`streams.LiveStream` is the one there is): it
    renders an event to frames, once per render unit, and sends or closes its socket."""

    #: Subscribers of one class with equal `render_share_key()` share one render.
    shared_render: ClassVar[bool]
    #: `render` reads the database, so it runs on the ORM thread.
    render_uses_orm: ClassVar[bool]

    def render(self, event: str, payload: dict[str, Any]) -> Sequence[Frame]: ...

    def render_share_key(self) -> Hashable: ...

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None: ...

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None: ...


class Subscription:
    """One subscriber's place in the process's fan-out."""

    __slots__ = ("__weakref__", "backlog", "dropped", "groups", "stream", "versions", "writer")

    def __init__(self, stream: Subscriber, writer: SocketWriter | None) -> None:
        self.stream = stream
        self.writer = writer
        self.groups: tuple[str, ...] = ()
        #: Cut off for not keeping up: nothing more is sent; its disconnect still leaves.
        self.dropped = False
        #: Events that arrived while the stream was resyncing; None once it is live.
        self.backlog: list[dict[str, Any]] | None = []
        #: The newest version of each thing a `Versioned` frame sent this socket (only streams
        #: that render such frames fill it: one entry per thing the socket can see).
        self.versions: dict[Hashable, int] = {}

    def take(self, frames: Sequence[Frame], *, resync: bool = False) -> list[str]:
        """The text of the frames this socket is to be sent, in order, noting their versions.
        A `Versioned` frame whose things the socket already has at that version or newer is
        left out; a resync's frames always go (they are where the socket starts from)."""
        out: list[str] = []
        versions = self.versions
        for frame in frames:
            if not isinstance(frame, Versioned):
                if frame:
                    out.append(frame)
                continue
            if not resync and any(
                versions.get(thing, -1) >= version for thing, version in frame.versions
            ):
                continue
            for thing, version in frame.versions:
                if version > versions.get(thing, -1):
                    versions[thing] = version
            if frame.text:
                out.append(frame.text)
        return out


class Feed:
    """One group's subscription in this process, and who is listening to it here."""

    def __init__(self, fanout: Fanout, group: str) -> None:
        self.fanout = fanout
        self.group = group
        # Insertion-ordered, so a render unit's subscribers are served in the order they came.
        self.subscribers: dict[Subscription, None] = {}
        self.channel: str | None = None
        self.reader: asyncio.Task[None] | None = None
        # One delivery at a time, and nobody joins during one: a render reads the rows when it
        # runs, so a delivery that overtook another could send an older state after a newer,
        # and a socket joining while a delivery is under way would be in neither its list of
        # subscribers nor after it (its resync may read before the render does).
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        layer = self.fanout.layer
        self.channel = await layer.new_channel("fanout.")
        await layer.group_add(self.group, self.channel)
        self.reader = asyncio.get_running_loop().create_task(self._read(self.channel))

    async def stop(self) -> None:
        if self.reader is not None:
            self.reader.cancel()  # channels_redis unsubscribes a channel whose receive is cancelled
            await asyncio.gather(self.reader, return_exceptions=True)
        if self.channel is not None:
            await self.fanout.layer.group_discard(self.group, self.channel)

    async def _read(self, channel: str) -> None:
        layer = self.fanout.layer
        while True:
            message = await layer.receive(channel)
            if message.get("type") != "stream.event":
                continue
            try:
                await self.deliver(message)
            except Exception:  # one bad event must not end the stream for everybody
                logger.exception("live event to %s was not delivered", self.group)

    async def deliver(self, message: dict[str, Any]) -> None:
        """`message` to everybody listening here, after the delivery under way (if any)."""
        async with self.lock:
            await self.fanout.deliver(list(self.subscribers), message)


class Fanout:
    """The fan-out of one event loop (a server process has one)."""

    def __init__(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            raise RuntimeError("live streams need a channel layer")
        self.layer = layer
        self.feeds: dict[str, Feed] = {}
        self._lock = asyncio.Lock()  # starting and stopping feeds; delivery never waits on it
        self._closing: set[asyncio.Future[None]] = set()

    async def join(self, subscription: Subscription, groups: tuple[str, ...]) -> None:
        """Subscribe to `groups` (the group's feed starts on its first subscriber here).
        Events reach the subscription's backlog until `go_live`."""
        async with self._lock:
            for group in groups:
                feed = self.feeds.get(group)
                if feed is None:
                    feed = Feed(self, group)
                    await feed.start()
                    self.feeds[group] = feed
                async with feed.lock:  # between deliveries, never during one
                    feed.subscribers[subscription] = None
            subscription.groups = groups

    async def leave(self, subscription: Subscription) -> None:
        """Stop delivering to it; a feed nobody here listens to any more is stopped."""
        subscription.backlog = None
        groups, subscription.groups = subscription.groups, ()
        for group in groups:
            feed = self.feeds.get(group)
            if feed is not None:
                feed.subscribers.pop(subscription, None)
        async with self._lock:
            for group in groups:
                feed = self.feeds.get(group)
                if feed is not None and not feed.subscribers:
                    del self.feeds[group]
                    await feed.stop()

    async def deliver(self, subscribers: list[Subscription], message: dict[str, Any]) -> None:
        """Render `message` once per render unit and send it to each live subscriber."""
        units: dict[Hashable, list[Subscription]] = {}
        for sub in subscribers:
            if sub.dropped:
                continue
            if sub.backlog is not None:
                if len(sub.backlog) >= BACKLOG_LIMIT:
                    self.drop(sub, "fell too far behind while resyncing")
                else:
                    sub.backlog.append(message)
                continue
            stream = sub.stream
            key: Hashable = (
                (type(stream), stream.render_share_key()) if stream.shared_render else sub
            )
            units.setdefault(key, []).append(sub)
        if not units:
            return
        event, payload = message["event"], message.get("payload") or {}
        renders = [
            functools.partial(unit[0].stream.render, event, payload) for unit in units.values()
        ]
        outcomes = await _render_all(units, renders)
        fallback: list[asyncio.Future[None]] = []
        for unit, (ok, frames) in zip(units.values(), outcomes, strict=True):
            if not ok:
                logger.error(
                    "rendering %s for %s failed",
                    event,
                    type(unit[0].stream).__name__,
                    exc_info=frames,
                )
                continue
            frames = [f for f in frames if text_of(f)]
            if not frames:
                continue
            texts = [text_of(f) for f in frames]
            versioned = any(isinstance(f, Versioned) for f in frames)
            data = encode_text(texts) if any(s.writer for s in unit) else b""
            for sub in unit:
                if not sub.groups or sub.dropped:  # a render may have taken a while
                    continue
                if versioned:  # what this socket already has stays out
                    mine = sub.take(frames)
                    if len(mine) != len(texts):
                        if mine:
                            self.send(sub, encode_text(mine) if sub.writer else b"", mine, fallback)
                        continue
                self.send(sub, data, texts, fallback)
        if fallback:
            await asyncio.gather(*fallback)

    def send(
        self,
        sub: Subscription,
        data: bytes,
        frames: list[str],
        fallback: list[asyncio.Future[None]] | None = None,
    ) -> None:
        """Write `data` (the encoded `frames`) to a live subscriber, or drop it if it lags.
        Without a direct writer, the ASGI send runs as a future added to `fallback`."""
        writer = sub.writer
        if writer is not None:
            if not writer.open:
                return  # closing: uvicorn tells the consumer, which leaves
            unsent = writer.buffered()
            if unsent > SLOW_CLIENT_BUFFER_BYTES:
                self.drop(sub, f"does not read its socket ({unsent} bytes unsent)")
                return
            writer.write(data)
            return
        future = asyncio.ensure_future(self._send_asgi(sub, frames))
        if fallback is not None:
            fallback.append(future)

    async def _send_asgi(self, sub: Subscription, frames: list[str]) -> None:
        try:
            async with asyncio.timeout(SLOW_SEND_SECONDS):
                for frame in frames:
                    await sub.stream.send(text_data=frame)
        except TimeoutError:
            self.drop(sub, f"did not take a frame within {SLOW_SEND_SECONDS} s")
        except Exception:  # the client went away mid-send: its disconnect cleans up
            logger.debug("live frame to a closing socket not sent", exc_info=True)

    def drop(self, sub: Subscription, why: str) -> None:
        """Stop serving a client that cannot keep up and cut its connection; it reconnects
        and resyncs. Its consumer's disconnect then leaves the feeds."""
        if sub.dropped:
            return
        # A warning: an operator should see clients cut off (a proxy buffering, a frozen tab).
        logger.warning("dropped a %s subscriber that %s", type(sub.stream).__name__, why)
        sub.dropped = True
        sub.backlog = None
        for group in sub.groups:  # `leave` still stops the feeds this empties
            feed = self.feeds.get(group)
            if feed is not None:
                feed.subscribers.pop(sub, None)
        if sub.writer is not None:
            sub.writer.abort()
        else:
            closing = asyncio.ensure_future(sub.stream.close(code=TRY_AGAIN_LATER))
            self._closing.add(closing)  # held: the loop keeps only a weak reference
            closing.add_done_callback(self._closing.discard)


async def _render_all(
    units: dict[Hashable, list[Subscription]], renders: list[functools.partial[Sequence[Frame]]]
) -> list[tuple[bool, Any]]:
    """Each unit's frames: renders that touch no database run here, the rest in one hop to
    the database thread together."""
    outcomes: list[tuple[bool, Any] | None] = []
    orm_calls: list[tuple[int, Callable[[], Any]]] = []
    for index, (unit, render) in enumerate(zip(units.values(), renders, strict=True)):
        if unit[0].stream.render_uses_orm:
            outcomes.append(None)
            orm_calls.append((index, render))
        else:
            outcomes.extend(call_each([render]))
    if orm_calls:
        results = await orm_hop(functools.partial(call_each, [call for _, call in orm_calls]))
        for (index, _), result in zip(orm_calls, results, strict=True):
            outcomes[index] = result
    return [o for o in outcomes if o is not None]


_fanouts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Fanout] = weakref.WeakKeyDictionary()


def process_fanout() -> Fanout:
    """The fan-out of the running event loop, made on first use."""
    loop = asyncio.get_running_loop()
    fanout = _fanouts.get(loop)
    if fanout is None:
        fanout = _fanouts[loop] = Fanout()
    return fanout
