"""What a `GET /v1/rl/workers` listing is made of, shared by both of its parsers.

`discovery` (the detailed validator, with a reason for every refusal) and `discovery_fast` (the
plain-code path for a well-formed listing) both build these types and apply these rules; keeping
them here lets each parser import them without importing the other (contract §1.2 to §1.5).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from controlplane.jsontypes import OpaqueJson

from .urls import url_problem

#: A worker's `transport` as the listener reports it (`fleet.Worker.transport`): Dynamo's
#: externally tagged enum, `{"tcp": "<address>/<id>/<path>"}` or `{"nats_tcp": ...}`. Stored as
#: reported: an object (the parser bounds its size), whose tag and value are the listener's.
type ListenerTransport = dict[str, OpaqueJson]

__all__ = [
    "SUPPORTED_PROTOCOL_VERSIONS",
    "U32_MAX",
    "U64_MAX",
    "DiscoveredWorker",
    "DiscoveryResult",
    "RejectedEntry",
    "RepeatedKeys",
    "WorkerIdentity",
    "admin_base_url_problem",
    "object_pairs",
    "system_url_problem",
    "worker_key",
]

SUPPORTED_PROTOCOL_VERSIONS = frozenset({1})

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1


def worker_key(namespace: str, component: str, endpoint: str, instance_id: int | str) -> str:
    """A worker's one text key, `namespace/component/endpoint/instance_id`, used everywhere.

    `instance_id` is a u64 that may exceed 2^63, so it is kept as decimal text (an int or the
    text a database column holds give the same key).
    """
    return f"{namespace}/{component}/{endpoint}/{instance_id}"


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """A worker is (namespace, component, endpoint, instance_id) — never a list position."""

    namespace: str
    component: str
    endpoint: str
    instance_id: int

    @property
    def key(self) -> str:
        return worker_key(self.namespace, self.component, self.endpoint, self.instance_id)


@dataclass(frozen=True, slots=True)
class DiscoveredWorker:
    """One validated entry. Optional fields are None exactly when the listener omitted them."""

    identity: WorkerIdentity
    transport: ListenerTransport
    request_plane_url: str
    routes: tuple[str, ...]
    system_url: str | None = None
    admin_base_url: str | None = None
    model: str | None = None
    world_size: int | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return self.identity.key

    @property
    def available(self) -> bool:
        """False for probe-error entries: listed, but not usable for admin calls."""
        return self.error is None


@dataclass(frozen=True, slots=True)
class RejectedEntry:
    """An entry we could not validate. `raw` is the JSON value as received when it is small and
    storable, else a truncated JSON text of it (`limits.raw_preview`), for display."""

    index: int
    reason: str
    raw: Any


@dataclass(frozen=True, slots=True)
class DiscoveryResult:
    protocol_version: int
    namespace: str
    workers: tuple[DiscoveredWorker, ...]
    rejected: tuple[RejectedEntry, ...] = ()


class RepeatedKeys(dict[str, Any]):
    """A JSON object that gave a key more than once (the dict holds the last value)."""

    __slots__ = ("repeated",)
    repeated: list[str]


def object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The JSON decoder's object hook: a plain dict, or a `RepeatedKeys` naming keys given twice."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    marked = RepeatedKeys(obj)
    counts = Counter(key for key, _ in pairs)
    marked.repeated = sorted(key for key, n in counts.items() if n > 1)
    return marked


def admin_base_url_problem(url: str) -> str | None:
    """The listener's admin base URL rules (§1.5), with its wording. None when valid."""
    return url_problem(url, "RL admin base URL", allow_padding=True)


def system_url_problem(url: str) -> str | None:
    """The rules for a worker's `system_url`, with their wording. None when valid."""
    # The listener copies system_url without validating it; we need an http(s) base to call.
    # Anything else in it (userinfo, query) is the outbound policy's to refuse at call time.
    return url_problem(
        url,
        "system_url",
        allow_padding=True,
        allow_userinfo=True,
        allow_query=True,
        allow_fragment=True,
    )
