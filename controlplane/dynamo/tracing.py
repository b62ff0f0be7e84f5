"""Optional OpenTelemetry for calls to Dynamo: a client span per call and its `traceparent`.

Dynamo's frontend and workers export OpenTelemetry traces of their own; sending W3C trace
context on our calls makes their spans children of ours, so a policy refresh's generation
checks and admin calls show up inside the refresh's trace.

Only the OpenTelemetry API is used (the caller sets up the SDK and calls `activate()`), and
only inside a trace: with no current span (tracing off, or a call made outside any traced work)
nothing is started and no header is added. Without the `opentelemetry` package at all, both
hooks below are the identity.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Concatenate, Protocol
from urllib.parse import urlsplit

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - the control plane installs it; plain users may not
    trace = None  # type: ignore[assignment]

_TRACER_NAME = "controlplane.dynamo"


class _HasStatus(Protocol):
    @property
    def status(self) -> int: ...


#: Set by `activate()`: until whoever sets up the OpenTelemetry SDK calls it, each hook costs
#: one check of this flag (looking up the current span costs microseconds per call, and a
#: refresh makes thousands of calls).
_active = False


def activate() -> None:
    """Turn the hooks on; called once the process has a tracer provider (telemetry.py)."""
    global _active
    _active = trace is not None


def _in_trace() -> bool:
    return _active and trace.get_current_span().get_span_context().is_valid


def with_trace_context(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """`headers` plus `traceparent` (and `tracestate`) of the current span, if there is one.
    `None` stays `None` outside a trace: the session's default headers then apply as they are."""
    if not _in_trace():
        return headers
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {**(headers or {}), **carrier} if carrier else headers


def traced_call[C, **P, R: _HasStatus](
    send: Callable[Concatenate[C, str, str, P], Awaitable[R]],
) -> Callable[Concatenate[C, str, str, P], Awaitable[R]]:
    """Wrap `DynamoClient.send` in a client span (named by method and path, which are few:
    the listener's and the admin routes), current while the request is built so that
    `with_trace_context` sends this span's id.

    Outside a trace the wrapper hands back `send`'s own coroutine (a plain function, not a
    coroutine of its own): a refresh makes thousands of calls, and an extra coroutine frame
    resumed at every step of each was measurable.
    """
    if trace is None:
        return send

    async def spanned(self: C, method: str, url: str, /, *args: P.args, **kwargs: P.kwargs) -> R:
        parts = urlsplit(url)
        attributes: dict[str, str | int] = {
            "http.request.method": method,
            "url.full": url,
            "server.address": parts.hostname or "",
        }
        if parts.port is not None:
            attributes["server.port"] = parts.port
        tracer = trace.get_tracer(_TRACER_NAME)
        with tracer.start_as_current_span(
            f"{method} {parts.path or '/'}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            reply = await send(self, method, url, *args, **kwargs)
            span.set_attribute("http.response.status_code", reply.status)
            if reply.status >= 400:
                span.set_status(Status(StatusCode.ERROR, f"HTTP {reply.status}"))
            return reply

    @functools.wraps(send)
    def traced(
        self: C, method: str, url: str, /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[R]:
        if not _in_trace():
            return send(self, method, url, *args, **kwargs)
        return spanned(self, method, url, *args, **kwargs)

    return traced
