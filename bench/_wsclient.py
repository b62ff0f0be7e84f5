"""A websocket client lean enough to hold thousands of subscribers in one bench process.

`bench/ws_fanout.py` runs its subscribers on the same cores as the server it measures. With
aiohttp's websocket client every text frame wakes the socket's reader task (a queue, a future,
an `async for` step), and at 10,000 subscribers that costs about as much CPU per frame as the
server spends sending it: the harness slowed the server it timed. In production the
subscribers are browsers and rollout workers on other machines.

Here each connection is an `asyncio.Protocol`: the handshake (RFC 6455 §4.1, with the
`Sec-WebSocket-Accept` check) and the frame parsing run in `data_received`, and each complete
text message goes to a plain callback with the time it was read off the socket. Pings are
answered with a pong, a close frame with a close; client frames are masked, as the RFC
requires. No extensions are offered, so frames arrive uncompressed. It implements what the
bench needs, not a general client: no fragmented frames are sent, and an oversized or
malformed frame closes the connection.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
import time
from collections.abc import Callable
from urllib.parse import urlsplit

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_MESSAGE = 1 << 24
_TEXT, _CONTINUATION, _CLOSE, _PING, _PONG = 0x1, 0x0, 0x8, 0x9, 0xA


def _client_frame(opcode: int, payload: bytes) -> bytes:
    """One masked, final client frame (RFC 6455 §5.3)."""
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


class Connection(asyncio.Protocol):
    """One websocket. `opened` resolves once the server accepted the upgrade (or fails with
    why it did not); `closed` resolves when the connection is gone. `on_text(data, at)` gets
    each text message with the `time.time()` at which its last bytes were read."""

    def __init__(self, request: bytes, key: bytes, on_text: Callable[[bytes, float], None]):
        self._request = request
        self._accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
        self.on_text = on_text
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.close_code: int | None = None
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._upgraded = False
        self._message: bytearray | None = None  # a fragmented text message being gathered

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but write the same way.
        self._transport = transport  # type: ignore[assignment]
        transport.write(self._request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.time()
        self._buffer += data
        if not self._upgraded and not self._handshake():
            return
        self._frames(now)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(f"closed before the upgrade: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)

    # -- the client's side ----------------------------------------------------------------

    def close(self, code: int = 1000) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(_client_frame(_CLOSE, struct.pack("!H", code)))

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # -- reading ------------------------------------------------------------------------------

    def _handshake(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > 65536:
                self._fail(ConnectionError("handshake response too large"))
            return False
        head = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        del self._buffer[: end + 4]
        status = head[0].split(" ", 2)
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if len(status) < 2 or status[1] != "101":
            self._fail(ConnectionError(f"upgrade refused: {head[0]}"))
            return False
        if headers.get("sec-websocket-accept", "").encode() != self._accept:
            self._fail(ConnectionError("wrong Sec-WebSocket-Accept"))
            return False
        self._upgraded = True
        self.opened.set_result(None)
        return True

    def _frames(self, now: float) -> None:
        buffer = self._buffer
        offset = 0
        while len(buffer) - offset >= 2:
            first, second = buffer[offset], buffer[offset + 1]
            size = second & 0x7F
            start = offset + 2
            if size == 126:
                if len(buffer) - offset < 4:
                    break
                size = int.from_bytes(buffer[start : start + 2], "big")
                start += 2
            elif size == 127:
                if len(buffer) - offset < 10:
                    break
                size = int.from_bytes(buffer[start : start + 8], "big")
                start += 8
            if second & 0x80 or size > _MAX_MESSAGE:  # servers never mask (RFC 6455 §5.1)
                self._fail(ConnectionError("malformed frame from the server"))
                return
            if len(buffer) < start + size:
                break
            payload = bytes(buffer[start : start + size])
            offset = start + size
            self._frame(first & 0x80, first & 0x0F, payload, now)
        del buffer[:offset]

    def _frame(self, fin: int, opcode: int, payload: bytes, now: float) -> None:
        if opcode == _TEXT or (opcode == _CONTINUATION and self._message is not None):
            if opcode == _TEXT:
                self._message = bytearray()
            assert self._message is not None
            self._message += payload
            if fin:
                message, self._message = bytes(self._message), None
                self.on_text(message, now)
        elif opcode == _PING:
            assert self._transport is not None
            self._transport.write(_client_frame(_PONG, payload))
        elif opcode == _CLOSE:
            self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            self.close(self.close_code if self.close_code != 1005 else 1000)
            assert self._transport is not None
            self._transport.close()

    def _fail(self, exc: Exception) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc)
        self.abort()


async def connect(
    url: str,
    headers: dict[str, str],
    on_text: Callable[[bytes, float], None],
    timeout: float = 120.0,
) -> Connection:
    """Open a websocket to `url` (`ws://` only) sending `headers`; returns once upgraded, or
    raises (TimeoutError after `timeout` s)."""
    parts = urlsplit(url)
    if parts.scheme != "ws" or not parts.hostname:
        raise ValueError(f"a ws:// URL is needed, not {url!r}")
    port = parts.port or 80
    key = base64.b64encode(os.urandom(16))
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {parts.hostname}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key.decode()}",
        "Sec-WebSocket-Version: 13",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    loop = asyncio.get_running_loop()
    _transport, protocol = await loop.create_connection(
        lambda: Connection(request, key, on_text), parts.hostname, port
    )
    try:
        async with asyncio.timeout(timeout):
            await protocol.opened
    except BaseException:
        protocol.abort()
        raise
    return protocol
