"""The one outbound HTTP client for Dynamo: an aiohttp session with our rules, nothing stacked.

Every Dynamo call (listener, worker admin routes, frontend) goes through `DynamoClient.send`:

- redirects are never followed (a redirect could point an unauthenticated admin call past the
  outbound policy); a 3xx comes back as a reply for the caller to report;
- every call has an explicit deadline bounding the whole exchange (connect, send, wait, read);
- proxies from the environment are ignored (admin traffic must go straight to the allowlisted
  addresses), and no cookies are kept between calls;
- bodies are read up to a cap and given up beyond it;
- one TLS context is built once and shared by every client.

Failures on the wire raise the `TransportError` family from `errors` (timeout, connect failed,
connection dropped, protocol error), never the library's own exceptions.

aiohttp is used directly because a policy refresh or a discovery run fans out to thousands
of workers at once: httpx's pool cost several times more per call than aiohttp's at that
fan-out, and every layer on top of aiohttp (request objects, URL models, response wrappers)
costs CPU per call too. `bench/discovery.py` and `bench/policy_refresh.py` compare a refresh with
a bare aiohttp client in the same run.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Final

import aiohttp
import certifi

from .errors import CallTimeout, ConnectFailed, ConnectionDropped, ProtocolError, TransportError
from .trace_join import call_headers
from .tracing import traced_call, with_trace_context

#: Default cap on a response body read from a worker or frontend.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
USER_AGENT = "dynamo-rl-controlplane"
#: Sent with every request (the same headers the previous httpx-based client sent).
_BASE_HEADERS: Final = {
    "accept": "*/*",
    "accept-encoding": "gzip, deflate",
    "connection": "keep-alive",
    "user-agent": USER_AGENT,
}
#: Added to the session's headers for a request with a JSON body.
_JSON_HEADERS: Final = {"content-type": "application/json"}
_READ_CHUNK = 16 * 1024
#: aiohttp's own timers (connect, per-read) would start after our deadline and fire after it,
#: so they are left off: at thousands of calls, a timer per read is real CPU.
_NO_AIOHTTP_TIMERS: Final = aiohttp.ClientTimeout()
_KEEPALIVE_SECONDS = 30.0


class _NoBody:
    """The type of `NO_BODY`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_BODY"


#: `send(json_body=NO_BODY)`: a request without a body (GET, HEAD).
NO_BODY: Final = _NoBody()


@dataclass(frozen=True, slots=True)
class Reply:
    """Status, headers and body (None when over the cap) of one request."""

    status: int
    headers: Mapping[str, str]
    raw: bytes | None


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one TLS context every client shares (certifi's CA bundle, as before).

    Loading the CA bundle costs ~45 ms and every discovery run and policy refresh run
    builds a client; the context is read-only once built.
    """
    return ssl.create_default_context(cafile=certifi.where())


class EncodedJson(bytes):
    """A JSON body already encoded by `encode_json`: `send` puts it on the wire as is (a
    fan-out encodes one body for thousands of calls)."""

    __slots__ = ()


def encode_json(body: object) -> EncodedJson:
    """Compact, UTF-8, no NaN: byte for byte what the previous httpx client sent for `json=`."""
    return EncodedJson(
        json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    )


def _json_bytes(body: object) -> bytes:
    return body if isinstance(body, EncodedJson) else encode_json(body)


def transport_error(exc: aiohttp.ClientError | OSError) -> TransportError:
    """Our name for a failure on the wire, in one line."""
    # A response error's str() is a repr of status, message and URL; the message says it.
    text = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
    detail = text or type(exc).__name__
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, unreachable, DNS, TLS handshake
        return ConnectFailed(detail)
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | OSError):
        return ConnectionDropped(detail)  # closed or reset mid-exchange, body cut short
    return ProtocolError(detail)  # a reply that is not HTTP, an invalid URL, ...


class DynamoClient:
    """One connection pool for one refresh, used as `async with make_client(...) as client`.

    `timeout` is the deadline of a call that does not name its own.
    """

    def __init__(
        self,
        *,
        timeout: float,
        max_connections: int = 100,
        request_class: type[aiohttp.ClientRequest] = aiohttp.ClientRequest,
    ) -> None:
        if not timeout > 0:
            raise ValueError("timeout must be positive")
        if max_connections <= 0:
            raise ValueError("max_connections must be positive")
        self.timeout = timeout
        self.max_connections = max_connections
        #: aiohttp's request class: the refresh executor's marks how far a call got, to say
        #: whether a call an abort cancelled had reached its worker (`cancellation.py`).
        self.request_class = request_class
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> DynamoClient:
        # Built here, inside the event loop that will use it (aiohttp binds a session to it).
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            limit_per_host=0,
            ssl=tls_context(),
            keepalive_timeout=_KEEPALIVE_SECONDS,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=_NO_AIOHTTP_TIMERS,
            trust_env=False,  # no proxies (or netrc credentials) from the environment
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=True,
            # Session headers are merged per request from aiohttp's own multidict, several
            # times cheaper than the same headers passed as a dict with every call.
            headers=_BASE_HEADERS,
            request_class=self.request_class,
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @traced_call
    async def send(
        self,
        method: str,
        url: str,
        *,
        json_body: object = NO_BODY,
        timeout: float | None = None,
        limit: int = MAX_RESPONSE_BYTES,
        error_limit: int | None = None,
        accept: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
    ) -> Reply:
        """One request; redirects not followed; body read up to `limit` bytes.

        `json_body` is sent as JSON unless it is `NO_BODY` (an `EncodedJson` is sent as
        encoded). `error_limit` caps the body of a
        reply whose status is not 200 (default: `limit`), so an error page is never read to a
        payload's size. `timeout` (default: the client's) bounds the whole exchange.
        `extra_headers` replaces the trace-join headers of the current work
        (`trace_join.call_headers`), which every other call carries.
        `on_chunk` is called with each piece of the body as it arrives (a streamed reply's
        time to first token is measured there); the body is still returned whole.
        Raises `TransportError` subclasses only.
        """
        session = self._session
        if session is None:
            raise RuntimeError("DynamoClient used outside `async with`")
        deadline = self.timeout if timeout is None else timeout
        data = None if json_body is NO_BODY else _json_bytes(json_body)
        headers: Mapping[str, str] | None = None if data is None else _JSON_HEADERS
        if accept is not None:
            headers = {**(headers or {}), "accept": accept}
        # The trace join (trace_join.py): the version this work moves workers to, and for a
        # generation check its rollout and attempt (`extra_headers`).
        joined = extra_headers if extra_headers is not None else call_headers()
        if joined:
            headers = {**(headers or {}), **joined}
        headers = with_trace_context(headers)  # W3C traceparent inside a trace (tracing.py)
        try:
            async with asyncio.timeout(deadline):
                async with session.request(
                    method,
                    url,
                    data=data,
                    headers=headers,
                    allow_redirects=False,
                    compress=False,
                    timeout=_NO_AIOHTTP_TIMERS,
                ) as response:
                    cap = limit if error_limit is None or response.status == 200 else error_limit
                    raw = await _read_capped(response, cap, on_chunk)
                    return Reply(response.status, response.headers, raw)
        except TimeoutError:  # our deadline (aiohttp's own timers are off)
            raise CallTimeout(f"timed out after {deadline:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise transport_error(exc) from exc


def make_client(
    *,
    timeout: float,
    max_connections: int = 100,
    request_class: type[aiohttp.ClientRequest] = aiohttp.ClientRequest,
) -> DynamoClient:
    """A client with no redirects, an explicit default deadline and a bounded pool."""
    return DynamoClient(
        timeout=timeout, max_connections=max_connections, request_class=request_class
    )


async def _read_capped(
    response: aiohttp.ClientResponse,
    limit: int,
    on_chunk: Callable[[bytes], None] | None = None,
) -> bytes | None:
    """The decoded body, or None as soon as it is known to exceed `limit` bytes."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit():
        if int(declared) > limit:
            return None
        # aiohttp stops at the declared length, so this read is bounded; a compressed body is
        # read in chunks below, since its decoded size is what the cap is about.
        if not response.headers.get("content-encoding") and on_chunk is None:
            return await response.read()
    chunks: list[bytes] = []
    size = 0
    # Each read returns as soon as some bytes arrived, so a streamed event is seen when it lands.
    async for chunk in response.content.iter_chunked(_READ_CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        if on_chunk is not None:
            on_chunk(chunk)
        chunks.append(chunk)
    return b"".join(chunks)
