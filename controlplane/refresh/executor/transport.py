"""An httpx transport that puts requests on the wire with aiohttp.

Calls still go through `controlplane.dynamo` (`make_client`, `call_admin`,
`run_generation_check`: outbound policy, no redirects, timeouts, capped bodies, family
judgement). Only the wire is swapped: under a refresh's fan-out httpcore's asyncio pool spent
~8 ms of CPU per request against ~1 ms for aiohttp (bench/policy_refresh.py), which made the
bookkeeping-free baseline unreachable. Errors are mapped to the httpx exceptions `call_admin`
already classifies.
"""

from __future__ import annotations

import aiohttp
import httpx

from controlplane.dynamo.http import MAX_RESPONSE_BYTES


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, *, max_connections: int) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, force_close=False),
            trust_env=False,  # admin traffic goes straight to the allowlisted addresses
            auto_decompress=True,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        timeout = request.extensions.get("timeout", {})
        total = max((v for v in timeout.values() if v), default=None)
        try:
            async with self._session.request(
                request.method,
                str(request.url),
                data=body or None,
                headers=[(k, v) for k, v in request.headers.items() if k.lower() != "host"],
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=total),
            ) as response:
                chunks, size = [], 0
                async for chunk in response.content.iter_chunked(65536):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:  # enough to make read_capped refuse it
                        break
                return httpx.Response(
                    response.status,
                    headers=[
                        (k, v)
                        for k, v in response.headers.items()
                        if k.lower()
                        not in ("content-encoding", "transfer-encoding", "content-length")
                    ],
                    content=b"".join(chunks),
                    request=request,
                )
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "timed out", request=request) from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            raise httpx.RemoteProtocolError(
                str(exc) or type(exc).__name__, request=request
            ) from exc
        except aiohttp.ClientOSError as exc:
            raise httpx.ReadError(str(exc), request=request) from exc
        except aiohttp.ClientError as exc:
            raise httpx.TransportError(f"{type(exc).__name__}: {exc}", request=request) from exc

    async def aclose(self) -> None:
        await self._session.close()
