"""The one place outbound HTTP clients for Dynamo are built.

All Dynamo calls (listener, worker admin routes, frontend) go through a client from
`make_client`, so redirects are never followed (a redirect could point an unauthenticated admin
call past the outbound policy), timeouts are always explicit, and proxies from the environment
are ignored (admin traffic must go straight to the allowlisted addresses).

The transport underneath is aiohttp (through `httpx-aiohttp`): a policy refresh or a discovery
refresh fans out to thousands of workers at once, and httpx's own pool costs several times more
per call than aiohttp's at that fan-out. Callers still see the httpx API and httpx exceptions.

The fan-out calls themselves (`send_capped`: admin calls, generation checks) skip the httpx
layers and go straight to the transport's aiohttp session: at thousands of calls per refresh,
httpx's request building, URL parsing, cookie and redirect handling and response wrapping cost
as much CPU as aiohttp's whole request. The wire request (method, URL, headers, JSON bytes),
the pool, the timeouts and the httpx exceptions raised are the same as through the transport.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import AIOHTTP_EXC_MAP

#: Default cap on a response body read from a worker or frontend.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
USER_AGENT = "dynamo-rl-controlplane"
#: What httpx sends by default (besides the user agent), so both paths look alike on the wire.
_BASE_HEADERS = {
    "accept": "*/*",
    "accept-encoding": "gzip, deflate",
    "connection": "keep-alive",
    "user-agent": USER_AGENT,
}
_JSON_HEADERS = {**_BASE_HEADERS, "content-type": "application/json"}


def _upstream_error(exc: BaseException) -> BaseException:
    """The httpx exception `httpx_aiohttp` raises for an aiohttp one (itself when unmapped)."""
    mapped = None
    for from_exc, to_exc in AIOHTTP_EXC_MAP.items():
        if isinstance(exc, from_exc) and (mapped is None or issubclass(to_exc, mapped)):
            mapped = to_exc
    if mapped is None:
        return exc
    error = mapped(str(exc))
    error.__cause__ = exc
    return error


def _sending_error(exc: BaseException) -> BaseException:
    """`_upstream_error`, with a dropped or refused connection named for what it is."""
    error = _upstream_error(exc)
    if not isinstance(error, httpx.ConnectTimeout):
        return error
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(str(exc))
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError(str(exc) or "server disconnected")
    if isinstance(exc, aiohttp.ClientConnectionError) and not isinstance(
        exc, aiohttp.ServerTimeoutError
    ):
        return httpx.ReadError(str(exc) or type(exc).__name__)
    return error


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
            error = _sending_error(cause) if cause is not None else exc
            if isinstance(error, httpx.ConnectTimeout):
                raise
            raise error from cause

    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session under this transport (created on first use, as upstream does)."""
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        return self.client


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Loading the CA bundle costs ~45 ms, and a policy refresh builds a client per step; the
    # context is read-only once built, so every client shares one (same CAs as before).
    return httpx.create_ssl_context(verify=True, trust_env=False)


class DynamoClient(httpx.AsyncClient):
    """The httpx client `make_client` returns; `fanout` is its aiohttp transport, or None when
    a test or benchmark swapped the transport (then every call goes through httpx)."""

    fanout: _FanOutTransport | None = None


def make_client(
    *,
    timeout: float,
    max_connections: int = 100,
    transport: httpx.AsyncBaseTransport | None = None,
) -> DynamoClient:
    """An AsyncClient with no redirects, explicit timeouts and bounded connection pool.

    `transport` lets tests and benchmarks swap the transport (e.g. `httpx.MockTransport`)
    without changing any other setting.
    """
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    if max_connections <= 0:
        raise ValueError("max_connections must be positive")
    fanout = None
    if transport is None:
        transport = fanout = _FanOutTransport(
            verify=_tls_context(),
            trust_env=False,
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=30.0,
            ),
        )
    client = DynamoClient(
        follow_redirects=False,
        timeout=httpx.Timeout(timeout),
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=30.0,
        ),
        trust_env=False,
        transport=transport,
        headers={"user-agent": USER_AGENT},
    )
    client.fanout = fanout
    return client


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


@dataclass(frozen=True, slots=True)
class Reply:
    """Status, headers and body (None when over the cap) of one capped request."""

    status: int
    headers: Mapping[str, str]
    raw: bytes | None


def _json_bytes(body: Any) -> bytes:
    # Byte for byte what httpx sends for `json=body`.
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


async def send_capped(
    client: httpx.AsyncClient, method: str, url: str, *, json_body: Any, timeout: float, limit: int
) -> Reply:
    """One request, redirects not followed, body read up to `limit` bytes.

    `json_body` is sent as JSON unless it is `NO_BODY`. `timeout` bounds the whole exchange
    (TimeoutError when it runs out). Otherwise raises the httpx exceptions the httpx path
    raises (`httpx.TimeoutException`, `httpx.ConnectError`, ...), whichever path is taken.
    """
    async with asyncio.timeout(timeout):
        fanout = getattr(client, "fanout", None)
        if fanout is None:
            kwargs = {} if json_body is NO_BODY else {"json": json_body}
            async with client.stream(
                method, url, timeout=httpx.Timeout(timeout), follow_redirects=False, **kwargs
            ) as response:
                raw = await read_capped(response, limit)
                return Reply(response.status_code, response.headers, raw)
        return await _send_aiohttp(fanout.session(), method, url, json_body, limit)


#: aiohttp's own timers (connect, per-read) start after the deadline above and would fire
#: after it, so they are left off: at thousands of calls, a timer per read is real CPU.
_NO_AIOHTTP_TIMERS = aiohttp.ClientTimeout()


async def _send_aiohttp(session: aiohttp.ClientSession, method, url, json_body, limit) -> Reply:
    data = None if json_body is NO_BODY else _json_bytes(json_body)
    reading = False
    try:
        async with session.request(
            method,
            url,
            data=data,
            headers=_BASE_HEADERS if data is None else _JSON_HEADERS,
            allow_redirects=False,
            compress=False,
            timeout=_NO_AIOHTTP_TIMERS,
        ) as response:
            reading = True
            raw = await _read_aiohttp_capped(response, limit)
            return Reply(response.status, response.headers, raw)
    except aiohttp.ClientError as exc:
        # Reading the body, the transport's stream maps errors without the connect-phase
        # renaming; both paths raise the same httpx exception for the same failure.
        error = _upstream_error(exc) if reading else _sending_error(exc)
        if error is exc:
            raise
        raise error from exc


#: `send_capped(json_body=NO_BODY)`: a request without a body (GET, HEAD).
NO_BODY = object()


async def _read_aiohttp_capped(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit():
        if int(declared) > limit:
            return None
        # aiohttp stops at the declared length, so this read is bounded (and decoded, as the
        # httpx path's `aiter_bytes` is; the cap then applies to the decoded size below).
        if not response.headers.get("content-encoding"):
            return await response.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(16 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
