"""The frontend's `GET /health` instance list, and the real identity of a static worker.

A static worker (SGLang, or anything the RL listener does not report) has no discovery entry, so
its instance id is not handed to us: it is the id its runtime registered under, which the
frontend's `/health` lists with `namespace`, `component`, `endpoint`, `instance_id` and the
request-plane `transport` (contract §3, [V] on Dynamo 1.6.1). A worker's own system-server
`/health` does not carry it. The id is what `nvext.backend_instance_id` pins a generation to:
an id the frontend does not know is answered with HTTP 400, so an invented one can never pass.

`resolve_identity` is a pure function: one static worker's declaration against one listing.
A restart gives the worker a new id, so callers resolve again on every discovery.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from . import limits
from .errors import CallTimeout, ProtocolError, TransportError
from .http import DynamoClient
from .listing import U64_MAX, object_pairs
from .policy import OutboundPolicy

HEALTH_PATH = "/health"
#: A frontend listing thousands of instances is well under this.
MAX_HEALTH_BYTES = 8 * 1024 * 1024
#: The endpoint a serving worker registers its generation under (`generate` in every backend).
GENERATE_ENDPOINT = "generate"


class FrontendHealthError(Exception):
    """The frontend's `/health` could not be read or is not the documented shape."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RegisteredInstance:
    """One entry of the frontend's `instances`."""

    namespace: str
    component: str
    endpoint: str
    instance_id: int
    #: The request plane's address, e.g. `tcp` → `127.0.0.1:34047/<token>/ns/comp/generate`.
    transport: dict[str, Any]

    @property
    def host(self) -> str:
        """The host of the request-plane address ("" when the transport names none)."""
        for value in self.transport.values():
            if isinstance(value, str) and value:
                address = value.split("/", 1)[0]
                return (urlsplit(f"//{address}").hostname or "").lower()
        return ""


@dataclass(frozen=True, slots=True)
class FrontendInstances:
    instances: tuple[RegisteredInstance, ...]
    #: Entries that were not the documented shape, each with why (never silently dropped).
    rejected: tuple[str, ...] = ()


def _instance(raw: Any) -> RegisteredInstance:
    if not isinstance(raw, dict):
        raise ValueError("instance is not an object")
    names = []
    for key in ("namespace", "component", "endpoint"):
        value = raw.get(key)
        if not isinstance(value, str) or len(value) > limits.NAME_MAX or "\x00" in value:
            raise ValueError(f"instance has no valid {key!r}")
        names.append(value)
    iid = raw.get("instance_id")
    if type(iid) is not int or not 0 <= iid <= U64_MAX:
        raise ValueError("instance has no u64 'instance_id'")
    transport = raw.get("transport")
    if not isinstance(transport, dict):
        transport = {}
    namespace, component, endpoint = names
    return RegisteredInstance(namespace, component, endpoint, iid, transport)


def parse_frontend_health(raw: bytes) -> FrontendInstances:
    """Parse a `/health` body. Raises FrontendHealthError when it has no `instances` list."""
    try:
        doc = json.loads(raw, object_pairs_hook=object_pairs)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FrontendHealthError(f"frontend /health is not JSON: {exc}") from None
    instances = doc.get("instances") if isinstance(doc, dict) else None
    if not isinstance(instances, list):
        raise FrontendHealthError("frontend /health has no 'instances' list")
    good: list[RegisteredInstance] = []
    rejected: list[str] = []
    for index, entry in enumerate(instances):
        try:
            good.append(_instance(entry))
        except ValueError as exc:
            rejected.append(f"instance #{index}: {exc}")
    return FrontendInstances(tuple(good), tuple(rejected))


async def fetch_frontend_instances(
    client: DynamoClient, policy: OutboundPolicy, frontend_url: str, *, timeout: float
) -> FrontendInstances:
    """GET `{frontend_url}/health` and parse its instances. Raises FrontendHealthError."""
    url = frontend_url.rstrip("/") + HEALTH_PATH
    problem = await policy.aviolation(url)
    if problem is not None:
        raise FrontendHealthError(f"outbound policy: {problem}")
    try:
        reply = await client.send(
            "GET", url, timeout=timeout, limit=MAX_HEALTH_BYTES, accept="application/json"
        )
    except CallTimeout:
        raise FrontendHealthError(f"frontend /health timed out after {timeout:g}s") from None
    except (ProtocolError, TransportError) as exc:
        raise FrontendHealthError(f"frontend /health unreachable: {exc.reason}") from None
    if reply.status != 200:
        raise FrontendHealthError(f"frontend /health answered HTTP {reply.status}")
    if reply.raw is None:
        raise FrontendHealthError(f"frontend /health exceeds {MAX_HEALTH_BYTES} bytes")
    return parse_frontend_health(reply.raw)


@dataclass(frozen=True, slots=True)
class Identity:
    """What a static worker's identity resolved to.

    - `instance`: the registered instance it is (resolved or declared and confirmed);
    - `refusal`: the declaration cannot be trusted (a declared id the frontend does not list,
      several candidates and no declaration): the worker must not be touched;
    - neither: identity unknown (`note` says why). The worker may be refreshed by its URL, but
      never pinned for verification nor placed in a verified set.
    """

    instance: RegisteredInstance | None = None
    refusal: str = ""
    note: str = ""


def resolve_identity(
    *,
    name: str,
    namespace: str,
    component: str,
    endpoint: str,
    system_url: str,
    declared_id: str,
    listing: FrontendInstances | None,
    unavailable: str = "",
) -> Identity:
    """Match one static worker against the frontend's registered instances.

    Candidates share the worker's namespace, component and endpoint. Where several do, the
    request-plane host of the worker's `system_url` narrows them. A declared id must be among
    the candidates on every discovery (a restart changes it: the declaration then fails and
    says so, rather than pinning a generation to an id nobody serves).
    """
    where = f"{namespace}/{component}/{endpoint}"
    if listing is None:
        reason = unavailable or "the source has no frontend URL to read /health from"
        if declared_id:
            return Identity(
                refusal=f"static worker {name}: declared instance id {declared_id} cannot be "
                f"checked ({reason})"
            )
        return Identity(note=f"identity unknown: {reason}")
    candidates = [
        i
        for i in listing.instances
        if (i.namespace, i.component, i.endpoint) == (namespace, component, endpoint)
    ]
    if declared_id:
        for instance in candidates:
            if str(instance.instance_id) == declared_id:
                return Identity(instance=instance)
        listed = ", ".join(str(i.instance_id) for i in candidates[:5]) or "none"
        return Identity(
            refusal=f"static worker {name}: declared instance id {declared_id} is not "
            f"registered at the frontend as {where} (registered: {listed})"
        )
    if not candidates:
        return Identity(note=f"identity unknown: the frontend lists no instance of {where}")
    if len(candidates) == 1:
        return Identity(instance=candidates[0])
    host = (urlsplit(system_url).hostname or "").lower()
    narrowed = [i for i in candidates if host and i.host == host]
    if len(narrowed) == 1:
        return Identity(instance=narrowed[0])
    ids = ", ".join(str(i.instance_id) for i in (narrowed or candidates)[:5])
    return Identity(
        refusal=f"static worker {name}: ambiguous identity, {len(narrowed or candidates)} "
        f"instances of {where} match ({ids}); declare its instance id"
    )
