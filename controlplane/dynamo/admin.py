"""Sending one admin call to one worker and judging it.

`call_admin` never raises for network or policy problems: the refresh executor journals every
attempt, so every outcome — policy refusal, timeout, dropped connection, error body — comes back
as an `AdminCallResult` with `ok=False` and a one-line `error`.

A fan-out sends the same call to thousands of workers, so what does not depend on the worker is
done once: a `PreparedCall` carries the call with its body already encoded (for the wire) and
serialised (for the journal), the outbound policy is judged once per worker origin
(`OutboundPolicy.admin_violation`), and `ReplyCache` decodes each distinct small reply body
once (a fleet answers `{"status": "ok"}` two thousand times).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .errors import CallTimeout, ConnectFailed, ConnectionDropped, TransportError, one_line
from .families.base import AdminCall, AdminFamily
from .http import MAX_RESPONSE_BYTES, NO_BODY, DynamoClient, EncodedJson, encode_json
from .jsonsafe import loads_bounded
from .policy import OutboundPolicy


@dataclass(frozen=True, slots=True)
class AdminCallResult:
    call: AdminCall
    url: str
    ok: bool
    http_status: int | None
    body: Any
    error: str | None
    duration_ms: float
    started_at: datetime
    finished_at: datetime
    data: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class PreparedCall:
    """An `AdminCall` with its body encoded once: `wire` is what is sent (NO_BODY for GET and
    HEAD, `{}` for a bodiless POST, as `call_admin` always sent), `body_json` the request body
    as the journal stores it (None when the call has none)."""

    call: AdminCall
    wire: EncodedJson | object
    body_json: str | None

    @classmethod
    def of(cls, call: AdminCall) -> PreparedCall:
        if call.method.upper() in ("GET", "HEAD"):
            wire: EncodedJson | object = NO_BODY
        else:
            wire = encode_json(call.body if call.body is not None else {})
        body_json = None if call.body is None else encode_json(call.body).decode()
        return cls(call, wire, body_json)


#: Reply bodies at most this long are decoded once per distinct content (see `ReplyCache`).
CACHED_REPLY_BYTES = 2048
#: Distinct reply bodies one cache keeps before starting over.
REPLY_CACHE_LIMIT = 1024


#: A judged reply: (ok, decoded body, one-line error or None, the family's data or None).
Judged = tuple[bool, Any, str | None, dict[str, Any] | None]


class ReplyCache:
    """Decoded reply bodies by their bytes, and the verdicts on them, for one run.

    Decoding is a pure function of the bytes and a family's verdict a pure function of the
    call's operation and path, the status and the decoded body, so both are kept per distinct
    reply (a fleet answers `{"status": "ok"}` two thousand times). The decoded values and the
    verdicts' data are shared between results and must not be mutated (nothing does: families
    and the executor read them, the journal serialises them)."""

    __slots__ = ("_decoded", "_verdicts")

    def __init__(self) -> None:
        self._decoded: dict[bytes, Any] = {}
        self._verdicts: dict[tuple[Any, ...], Judged] = {}

    def decode(self, raw: bytes) -> Any:
        if len(raw) > CACHED_REPLY_BYTES:
            return decode_body(raw)
        try:
            return self._decoded[raw]
        except KeyError:
            pass
        if len(self._decoded) >= REPLY_CACHE_LIMIT:
            self._decoded.clear()
        body = self._decoded[raw] = decode_body(raw)
        return body

    def judge(self, family: AdminFamily, call: AdminCall, status: int, raw: bytes) -> Judged:
        """`judge_reply` of a reply, once per distinct family, operation, path, status and
        body."""
        if len(raw) > CACHED_REPLY_BYTES:
            return judge_reply(family, call, status, decode_body(raw))
        key = (family, call.operation, call.path, status, raw)
        judged = self._verdicts.get(key)
        if judged is None:
            if len(self._verdicts) >= REPLY_CACHE_LIMIT:
                self._verdicts.clear()
            judged = self._verdicts[key] = judge_reply(family, call, status, self.decode(raw))
        return judged


def judge_reply(family: AdminFamily, call: AdminCall, status: int, body: Any) -> Judged:
    """A decoded (non-redirect) reply judged by `family`."""
    outcome = family.interpret(call, status, body)
    error = outcome.error
    return outcome.ok, body, one_line(error) if error is not None else None, outcome.data


def admin_url(system_url: str, call: AdminCall) -> str:
    """`system_url` + `/` + path, with the route verbatim (never renamed or stripped)."""
    return system_url.rstrip("/") + "/" + call.path


def decode_body(raw: bytes) -> Any:
    """JSON when it parses (the system server labels JSON as text/plain), else the text.

    Parsed with the shared bounds: a reply nested absurdly deep or carrying NaN/Infinity is kept
    as text (which no family accepts as success), so it is journaled as the failed call it is
    instead of crashing the executor or the journal's JSON column.
    """
    if not raw:
        return None
    try:
        # NUL is allowed here: the checks of the reply's fields (limits) name the one holding it.
        return loads_bounded(raw, max_bytes=max(len(raw), 1), allow_nul=True)
    except ValueError:
        return raw.decode("utf-8", "replace")


def transport_failure(exc: TransportError, timeout: float) -> str:
    """What an admin call that failed on the wire reports (one wording for every caller)."""
    if isinstance(exc, CallTimeout):
        return f"timed out after {timeout:g}s"
    if isinstance(exc, ConnectFailed):
        return f"connection failed: {exc.reason}"
    if isinstance(exc, ConnectionDropped):
        # A worker that hits EngineDeadError or an init watchdog exits mid-request.
        return f"connection dropped (worker may have exited): {exc.reason}"
    return f"request failed: {exc.reason}"


async def call_admin(
    client: DynamoClient,
    policy: OutboundPolicy,
    system_url: str,
    family: AdminFamily,
    call: AdminCall | PreparedCall,
    *,
    timeout: float,
    replies: ReplyCache | None = None,
) -> AdminCallResult:
    """Check `system_url` against `policy`, send `call`, judge the reply by `family`."""
    prepared = call if isinstance(call, PreparedCall) else PreparedCall.of(call)
    url = admin_url(system_url, prepared.call)
    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    status, (ok, body, error, data) = await exchange(
        client, policy, system_url, url, family, prepared, timeout=timeout, replies=replies
    )
    duration_ms = (time.perf_counter() - t0) * 1000.0
    return AdminCallResult(
        call=prepared.call,
        url=url,
        ok=ok,
        http_status=status,
        body=body,
        error=error,
        duration_ms=duration_ms,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        data=data,
    )


async def exchange(
    client: DynamoClient,
    policy: OutboundPolicy,
    system_url: str,
    url: str,
    family: AdminFamily,
    prepared: PreparedCall,
    *,
    timeout: float,
    replies: ReplyCache | None = None,
) -> tuple[int | None, Judged]:
    """`call_admin` without the result: the status (None when there was no reply) and the
    judged reply, for a caller that records the call in a shape of its own (the refresh
    executor's journal). `url` is `admin_url(system_url, prepared.call)`; never raises for
    network or policy problems."""
    problem = await policy.admin_violation(system_url)
    if problem is not None:
        return None, (False, None, one_line(f"outbound policy: {problem}"), None)
    call = prepared.call
    try:
        reply = await client.send(
            call.method, url, json_body=prepared.wire, timeout=timeout, limit=MAX_RESPONSE_BYTES
        )
    except TransportError as exc:
        return None, (False, None, one_line(transport_failure(exc, timeout)), None)
    status, raw = reply.status, reply.raw
    if raw is None:
        return status, (False, None, f"response body over {MAX_RESPONSE_BYTES} bytes", None)
    if 300 <= status < 400:  # the error quotes this reply's Location: never shared
        body = replies.decode(raw) if replies is not None else decode_body(raw)
        location = reply.headers.get("location", "")
        error = one_line(f"HTTP {status} redirect to {location!r} not followed")
        return status, (False, body, error, None)
    if replies is not None:
        return status, replies.judge(family, call, status, raw)
    return status, judge_reply(family, call, status, decode_body(raw))
