"""A tiny real HTTP server on 127.0.0.1 for client tests (redirects, drops, hangs, sizes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LocalServer:
    """Routes are registered per test; `hits` counts requests per path so tests can assert
    that a request was (or was not) sent."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.hits: dict[str, int] = {}
        self.bodies: dict[str, list[bytes]] = {}
        self.release = asyncio.Event()  # set at teardown so hanging handlers finish
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    def route(self, path: str, handler: Handler) -> None:
        self.handlers[path] = handler

    def json(self, path: str, body: object, status: int = 200, **kw) -> None:
        async def handler(_request: web.Request) -> web.StreamResponse:
            return web.json_response(body, status=status, **kw)

        self.route(path, handler)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.hits[path] = self.hits.get(path, 0) + 1
        self.bodies.setdefault(path, []).append(await request.read())
        handler = self.handlers.get(path)
        if handler is None:
            return web.json_response(
                {"error": "Route not found", "message": f"Route {path} not found"}, status=404
            )
        return await handler(request)

    async def hang(self, _request: web.Request) -> web.StreamResponse:
        await self.release.wait()
        return web.Response(text="late")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


async def drop_connection(request: web.Request) -> web.StreamResponse:
    """Close the socket without answering, like a worker that hit os._exit(1)."""
    assert request.transport is not None
    request.transport.abort()
    await asyncio.sleep(0)
    raise ConnectionResetError("dropped")


@pytest.fixture
async def server():
    srv = LocalServer()
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def not_http():
    """Base URL of a peer that answers every request with a line that is not HTTP."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        writer.close()

    peer = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with peer:
        yield f"http://127.0.0.1:{peer.sockets[0].getsockname()[1]}"


@pytest.fixture
async def client():
    async with make_client(timeout=5.0) as c:
        yield c


@pytest.fixture
def loopback_policy() -> OutboundPolicy:
    return OutboundPolicy.from_cidrs(["127.0.0.0/8"])
