"""Typed errors raised by the Dynamo client.

Every `.reason` is a single line that is safe to show an operator: no tracebacks, no bodies.
"""

from __future__ import annotations

_MAX_REASON = 500


def one_line(text: object, limit: int = _MAX_REASON) -> str:
    """Collapse whitespace/newlines and truncate, so reasons never break log lines or tables."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


class DynamoError(Exception):
    """Base class for everything the client raises on purpose."""


class DiscoveryError(DynamoError):
    """The listener answer could not be used as a whole (transport, HTTP, or payload shape)."""

    def __init__(self, reason: str) -> None:
        self.reason = one_line(reason)
        super().__init__(self.reason)


class ProtocolVersionError(DiscoveryError):
    """`protocol_version` is missing or not one we understand; nothing else was parsed."""

    def __init__(self, reason: str, version: object = None) -> None:
        self.version = version
        super().__init__(reason)


class OutboundPolicyError(DynamoError):
    """A URL fails the source's outbound policy, so no request may be sent to it."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = one_line(reason)
        super().__init__(f"{self.reason} ({one_line(url, 200)})")


class TransportError(DynamoError):
    """One HTTP exchange failed before a complete reply was read. Subclasses say how.

    The client raises only these for the network (`http.DynamoClient.send`), so callers name a
    failure for what happened on the wire without knowing the library underneath.
    """

    def __init__(self, reason: str) -> None:
        self.reason = one_line(reason)
        super().__init__(self.reason)


class CallTimeout(TransportError):
    """The call's deadline ran out (connecting, sending, waiting or reading)."""


class ConnectFailed(TransportError):
    """No connection was made: refused, unreachable, name not resolved, TLS handshake failed."""


class ConnectionDropped(TransportError):
    """The peer closed or reset the connection mid-exchange (a worker that exited mid-call)."""


class ProtocolError(TransportError):
    """The peer answered something that is not HTTP, or the request could not be formed."""
