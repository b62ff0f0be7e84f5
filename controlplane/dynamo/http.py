"""The one place outbound HTTP clients for Dynamo are built.

All Dynamo calls (listener, worker admin routes, frontend) go through a client from
`make_client`, so redirects are never followed (a redirect could point an unauthenticated admin
call past the outbound policy), timeouts are always explicit, and proxies from the environment
are ignored (admin traffic must go straight to the allowlisted addresses).
"""

from __future__ import annotations

import httpx

#: Default cap on a response body read from a worker or frontend.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024


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
        transport=transport,
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
