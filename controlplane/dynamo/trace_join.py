"""Headers that let a trainer join our calls to what its workers served.

Every request the control plane sends to a worker or frontend on behalf of a policy refresh or
a quarantine catch-up carries `x-rl-policy-version`: the version that work is moving the
workers to. A generation check (the verify step's completion, a quarantine's agreement check)
also carries `x-rl-rollout-id` (`refresh-<id>` or `quarantine-<id>`) and a fresh
`x-rl-attempt-id` per request. Dynamo's request tracing can capture these headers
(`DYN_REQUEST_TRACE_HTTP_HEADER_CAPTURE_LIST`, docs/integrate/trace-join.md), so our
verification requests, and a trainer's own requests carrying the same names, land in the same
traces and logs as the version windows the control plane keeps.

The values come from a context variable set around the work (`serving`), so every client,
step and thread the work starts inherits them (asyncio tasks and `CallRuntime.submit` copy the
context) without threading them through each call. Outside such work nothing is added.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

POLICY_VERSION_HEADER = "x-rl-policy-version"
ROLLOUT_ID_HEADER = "x-rl-rollout-id"
ATTEMPT_ID_HEADER = "x-rl-attempt-id"
#: Header values are bounded and printable: a version is outside data (a trainer's string).
_MAX_VALUE = 256


@dataclass(frozen=True, slots=True)
class Work:
    """The refresh or catch-up whose calls are being sent."""

    policy_version: str
    rollout_id: str


_current: ContextVar[Work | None] = ContextVar("controlplane_dynamo_trace_join", default=None)


def header_value(value: object) -> str:
    """`value` as a header value: text, printable ASCII only (anything else escaped), bounded."""
    text = value if isinstance(value, str) else str(value)
    safe = "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in text)
    return safe[:_MAX_VALUE]


@contextlib.contextmanager
def serving(policy_version: object, rollout_id: str) -> Iterator[None]:
    """Inside: every call carries `policy_version`, generation checks `rollout_id`. A missing
    version (None, "") adds nothing."""
    if policy_version is None or policy_version == "":
        yield
        return
    token = _current.set(Work(header_value(policy_version), header_value(rollout_id)))
    try:
        yield
    finally:
        _current.reset(token)


def call_headers() -> dict[str, str]:
    """The headers every call carries now ({} outside a refresh or catch-up)."""
    work = _current.get()
    return {} if work is None else {POLICY_VERSION_HEADER: work.policy_version}


def verification_headers() -> dict[str, str]:
    """The headers of one generation check: the call's, plus the rollout and a new attempt."""
    work = _current.get()
    if work is None:
        return {}
    return {
        POLICY_VERSION_HEADER: work.policy_version,
        ROLLOUT_ID_HEADER: work.rollout_id,
        ATTEMPT_ID_HEADER: uuid.uuid4().hex,
    }
