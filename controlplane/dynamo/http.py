"""The one place outbound HTTP clients for Dynamo are built.

All Dynamo calls (listener, worker admin routes, frontend) go through a client from
`make_client`, so redirects are never followed (a redirect could point an unauthenticated admin
call past the outbound policy), timeouts are always explicit, and proxies from the environment
are ignored (admin traffic must go straight to the allowlisted addresses).

The transport underneath is aiohttp (through `httpx-aiohttp`): a policy refresh or a discovery
refresh fans out to thousands of workers at once, and httpx's own pool costs several times more
per call than aiohttp's at that fan-out. Callers still see the httpx API and httpx exceptions.
"""

from __future__ import annotations

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

#: Default cap on a response body read from a worker or frontend.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class _FanOutTransport(AiohttpTransport):
    """aiohttp underneath, with failures named for what happened on the wire.

    The upstream mapping turns a peer that closes the connection without answering (a worker
    process that died mid-call) into `ConnectTimeout`; callers need to tell "dropped" from
    "timed out", so those cases are re-raised as the httpx errors httpx itself would raise.
    """

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ClientConnectorError):
                raise httpx.ConnectError(str(cause)) from cause
            if isinstance(cause, aiohttp.ServerDisconnectedError):
                raise httpx.RemoteProtocolError(str(cause) or "server disconnected") from cause
            if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(
                cause, aiohttp.ServerTimeoutError
            ):
                raise httpx.ReadError(str(cause) or type(cause).__name__) from cause
            raise


def make_client(
    *,
    timeout: float,
    max_connections: int = 100,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """An AsyncClient with no redirects, explicit timeouts and bounded connection pool.

    `transport` lets tests and benchmarks swap the transport (e.g. `httpx.MockTransport`)
    without changing any other setting.
    """
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    if max_connections <= 0:
        raise ValueError("max_connections must be positive")
    return httpx.AsyncClient(
        follow_redirects=False,
        timeout=httpx.Timeout(timeout),
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=30.0,
        ),
        trust_env=False,
        transport=transport
        or _FanOutTransport(
            trust_env=False,
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=30.0,
            ),
        ),
        headers={"user-agent": "dynamo-rl-controlplane"},
    )


async def read_capped(response: httpx.Response, limit: int) -> bytes | None:
    """Read a streamed body, returning None as soon as it exceeds `limit` bytes."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
