"""HTTP plumbing shared by the three simulated servers (aiohttp low-level server)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

TEXT_JSON = "text/plain; charset=utf-8"
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


#: Request headers named so by the caller to join its traces (the control plane's
#: `x-rl-policy-version`, `x-rl-rollout-id`, `x-rl-attempt-id`): the fleet records them per
#: request (`SimFleet.received_headers`) so tests can see what a worker or frontend was sent.
TRACE_HEADER_PREFIX = "x-rl-"


def note_trace_headers(log: Any, server: str, request: web.BaseRequest) -> None:
    """Append the request's `x-rl-*` headers to `log` (a bounded deque)."""
    log.append(
        {
            "server": server,
            "method": request.method,
            "path": request.path,
            "headers": {
                k.lower(): v
                for k, v in request.headers.items()
                if k.lower().startswith(TRACE_HEADER_PREFIX)
            },
        }
    )


class DropConnection(Exception):
    """Raised by a handler to close the connection without sending any response."""


def dumps(body: Any) -> bytes:
    # Python's json writes big integers exactly, which keeps u64 instance ids intact.
    return json.dumps(body, separators=(",", ":")).encode()


def json_response(
    body: Any, status: int = 200, content_type: str = "application/json"
) -> web.Response:
    return web.Response(body=dumps(body), status=status, headers={"Content-Type": content_type})


def empty_response(status: int) -> web.Response:
    return web.Response(status=status, body=b"")


async def pause_for(seconds: float, stopping: asyncio.Event) -> None:
    """Sleep for `seconds`, waking early when the fleet stops (so hangs never block shutdown)."""
    if seconds <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)


def with_drop(handler: Handler) -> Handler:
    """Turn `DropConnection` into an abrupt close: the client sees a disconnect, not HTTP."""

    async def wrapped(request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await handler(request)
        except DropConnection:
            if request.transport is not None:
                request.transport.close()
            # aiohttp treats a cancelled handler as "no response"; nothing is written.
            raise asyncio.CancelledError() from None

    return wrapped


class HttpServer:
    """One listening socket on the loopback interface serving one handler."""

    def __init__(self, handler: Handler, host: str, port: int) -> None:
        self._server = web.Server(with_drop(handler), handler_cancellation=True, access_log=None)
        self._runner = web.ServerRunner(self._server, handle_signals=False, shutdown_timeout=1.0)
        self._host = host
        self._port = port
        self.port: int | None = None

    async def start(self) -> int:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, backlog=1024, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        await self._runner.cleanup()


def serde_style_json_error(exc: json.JSONDecodeError) -> str:
    """Approximate serde_json's message for invalid JSON (`expected ident at line 1 column 2`)."""
    text = exc.doc
    pos = exc.pos
    stripped = text[pos : pos + 1]
    if stripped and stripped in "ntf":
        # serde reads an identifier (null/true/false) and fails on the first wrong letter.
        word = {"n": "null", "t": "true", "f": "false"}[stripped]
        offset = 0
        while (
            offset < len(word) and pos + offset < len(text) and text[pos + offset] == word[offset]
        ):
            offset += 1
        line = text.count("\n", 0, pos + offset) + 1
        column = pos + offset - (text.rfind("\n", 0, pos + offset) + 1) + 1
        return f"expected ident at line {line} column {column}"
    if exc.msg.startswith("Expecting value") and pos >= len(text.rstrip()):
        return f"EOF while parsing a value at line {exc.lineno} column {max(exc.colno - 1, 0)}"
    return f"expected value at line {exc.lineno} column {exc.colno}"


async def read_json_body(request: web.BaseRequest) -> tuple[bool, Any]:
    """(ok, value): an empty body is `{}`; invalid JSON gives (False, serde-style message)."""
    raw = await request.read()
    if not raw.strip():
        return True, {}
    try:
        return True, json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if isinstance(exc, json.JSONDecodeError):
            return False, serde_style_json_error(exc)
        return False, "invalid UTF-8 in request body"
