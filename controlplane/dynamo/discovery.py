"""Parsing and fetching `GET /v1/rl/workers`, protocol 1 (contract §1.2 to §1.5).

The parser is strict about types because the payload decides where unauthenticated admin calls
go, and lenient about unknown keys (ignored, like the listener does for descriptors). A bad
*entry* becomes a `RejectedEntry` with a reason and never hides the others; a bad *payload*
raises `DiscoveryError` with one line saying why.

It is also the storage boundary: every value an accepted entry carries fits the column it lands
in (`limits`), so no payload can make storing a refresh fail. Problems that make the document
itself untrustworthy refuse the whole payload: NaN/Infinity anywhere (not JSON, though Python's
parser accepts them), numbers over 40 digits, nesting past `limits.MAX_DEPTH`, more than
`limits.MAX_ENTRIES` entries, oversize bodies, and a top-level key given twice. Inside an entry,
a key given twice rejects that entry: which value a producer meant is ambiguous (serde refuses
duplicate fields; Python keeps the last), so neither is trusted.
"""

from __future__ import annotations

import json
import math
from typing import Any

from . import limits
from .discovery_fast import parse_well_formed
from .errors import (
    CallTimeout,
    DiscoveryError,
    ProtocolError,
    ProtocolVersionError,
    TransportError,
    one_line,
)
from .http import DynamoClient
from .listing import (
    SUPPORTED_PROTOCOL_VERSIONS,
    U32_MAX,
    U64_MAX,
    DiscoveredWorker,
    DiscoveryResult,
    RejectedEntry,
    RepeatedKeys,
    WorkerIdentity,
    admin_base_url_problem,
    object_pairs,
    system_url_problem,
    worker_key,
)
from .policy import OutboundPolicy

# The listing's types live in `listing` (shared with the fast path); this module stays the face
# callers import them from.
__all__ = [
    "DISCOVERY_PATH",
    "MAX_DISCOVERY_BYTES",
    "MAX_ERROR_BODY_BYTES",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "U32_MAX",
    "U64_MAX",
    "DiscoveredWorker",
    "DiscoveryResult",
    "RejectedEntry",
    "WorkerIdentity",
    "admin_base_url_problem",
    "discovery_url",
    "fetch_discovery",
    "parse_discovery",
    "parse_instance_id",
    "parse_worker",
    "worker_key",
]

#: A listener reporting thousands of workers is ~1 MB; anything near this cap is not a listener.
MAX_DISCOVERY_BYTES = 16 * 1024 * 1024
#: Error bodies (e.g. `discovery_failed`) are small; don't read megabytes to show one message.
MAX_ERROR_BODY_BYTES = 64 * 1024
DISCOVERY_PATH = "/v1/rl/workers"


class _EntryError(ValueError):
    """Internal: one entry is malformed. Never escapes `parse_discovery`."""


class _PayloadError(ValueError):
    """Internal: raised from inside the JSON decoder's hooks; becomes a DiscoveryError."""


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 is a valid JSON number that Python reads as inf
        raise _PayloadError(f"discovery payload has a number out of range ({text[:40]})")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > limits.MAX_NUMBER_DIGITS:
        raise _PayloadError(
            f"discovery payload has a {len(text.lstrip('-'))}-digit number "
            f"(over {limits.MAX_NUMBER_DIGITS} digits)"
        )
    return int(text)


def _constant(name: str) -> Any:
    raise _PayloadError(f"discovery payload contains {name}, which JSON does not allow")


def _depth_over(value: object, limit: int) -> bool:
    """True when `value` nests deeper than `limit` (iterative: no recursion to exhaust).

    Level by level, one comprehension per level: a 2,000-worker listing has ~6,000 containers,
    and a per-item stack of (item, depth) pairs cost more than parsing the payload."""
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        if depth >= limit:
            return True
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
        depth += 1
    return False


def _check_text(name: str, value: str, limit: int) -> str:
    if problem := limits.text_problem(value, limit):
        raise _EntryError(f"'{name}' {problem}")
    return value


def _repeated_keys_problem(value: object) -> str | None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, RepeatedKeys):
            return f"repeats the key {one_line(repr(item.repeated[0]), 60)}"
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def _is_int(value: object) -> bool:
    # bool is an int subclass in Python; JSON `true` must never pass as a number.
    return isinstance(value, int) and not isinstance(value, bool)


def _required_str(entry: dict[str, Any], name: str, limit: int) -> str:
    if name not in entry:
        raise _EntryError(f"missing '{name}'")
    value = entry[name]
    if not isinstance(value, str):
        raise _EntryError(f"'{name}' must be a string")
    if not value:
        raise _EntryError(f"'{name}' must not be empty")
    return _check_text(name, value, limit)


def _optional(entry: dict[str, Any], name: str) -> Any:
    value = entry.get(name)
    if name in entry and value is None:
        # Protocol 1 omits absent fields; an explicit null means a different producer.
        raise _EntryError(f"'{name}' is null (protocol 1 omits absent fields)")
    return value


def _optional_str(entry: dict[str, Any], name: str, limit: int) -> str | None:
    value = _optional(entry, name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _EntryError(f"'{name}' must be a string")
    return _check_text(name, value, limit)


def parse_instance_id(value: object) -> int:
    """Exact u64: JSON integers only (no bools, floats or strings), 0..2^64-1."""
    if not _is_int(value):
        raise _EntryError("'instance_id' must be an unsigned 64-bit integer")
    assert isinstance(value, int)
    if value < 0 or value > U64_MAX:
        raise _EntryError(f"'instance_id' {value} is outside the unsigned 64-bit range")
    return value


def _parse_routes(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _EntryError("'routes' must be an array of strings")
    if len(value) > limits.ROUTES_MAX:
        raise _EntryError(f"'routes' has {len(value)} entries, over the {limits.ROUTES_MAX} limit")
    for route in value:
        if not isinstance(route, str):
            raise _EntryError("'routes' contains a non-string entry")
        if not route:
            raise _EntryError("'routes' contains an empty entry")
        if problem := limits.text_problem(route, limits.ROUTE_MAX):
            raise _EntryError(f"'routes' has an entry that {problem}")
    return tuple(value)


def _parse_transport(value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        raise _EntryError("'transport' must be a non-empty object")
    if problem := limits.json_problem(value, max_chars=limits.TRANSPORT_JSON_MAX):
        raise _EntryError(f"'transport' {problem}")
    return value


def parse_worker(entry: object) -> DiscoveredWorker:
    """Validate one worker entry (contract §1.3). Raises ValueError with the reason."""
    if not isinstance(entry, dict):
        raise _EntryError(f"entry must be an object, got {type(entry).__name__}")
    if isinstance(entry, RepeatedKeys):
        raise _EntryError(f"entry repeats the key {one_line(repr(entry.repeated[0]), 60)}")
    if "instance_id" not in entry:
        raise _EntryError("missing 'instance_id'")
    identity = WorkerIdentity(
        namespace=_required_str(entry, "namespace", limits.NAME_MAX),
        component=_required_str(entry, "component", limits.NAME_MAX),
        endpoint=_required_str(entry, "endpoint", limits.NAME_MAX),
        instance_id=parse_instance_id(entry["instance_id"]),
    )
    transport = _parse_transport(entry.get("transport"))
    if problem := _repeated_keys_problem(transport):
        raise _EntryError(f"'transport' {problem}")
    request_plane_url = _required_str(entry, "request_plane_url", limits.REQUEST_PLANE_URL_MAX)
    if "routes" not in entry:
        raise _EntryError("missing 'routes'")
    routes = _parse_routes(entry["routes"])

    system_url = _optional_str(entry, "system_url", limits.URL_MAX)
    if system_url is not None and (problem := system_url_problem(system_url)):
        raise _EntryError(problem)
    admin_base_url = _optional_str(entry, "admin_base_url", limits.URL_MAX)
    if admin_base_url is not None and (problem := admin_base_url_problem(admin_base_url)):
        raise _EntryError(f"invalid 'admin_base_url': {problem}")
    world_size = _optional(entry, "world_size")
    if world_size is not None and (not _is_int(world_size) or not 0 < world_size <= U32_MAX):
        raise _EntryError("'world_size' must be an integer between 1 and 2^32-1")
    model = _optional_str(entry, "model", limits.MODEL_MAX)
    error = _optional_str(entry, "error", limits.WORKER_ERROR_MAX)

    return DiscoveredWorker(
        identity=identity,
        transport=transport,
        request_plane_url=request_plane_url,
        routes=routes,
        system_url=system_url,
        admin_base_url=admin_base_url,
        model=model,
        world_size=world_size,
        error=error,
    )


def _load_json(body: bytes | str) -> object:
    size = len(body.encode("utf-8", "surrogatepass")) if isinstance(body, str) else len(body)
    if size > MAX_DISCOVERY_BYTES:
        raise DiscoveryError(
            f"discovery payload is {size} bytes, over the {MAX_DISCOVERY_BYTES}-byte limit"
        )
    too_deep = f"discovery payload is nested too deeply (over {limits.MAX_DEPTH} levels)"
    try:
        payload = json.loads(
            body,
            object_pairs_hook=object_pairs,
            parse_float=_float,
            parse_int=_int,
            parse_constant=_constant,
        )
    except RecursionError:
        raise DiscoveryError(too_deep) from None
    except _PayloadError as exc:
        raise DiscoveryError(str(exc)) from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DiscoveryError(f"discovery payload is not valid JSON: {one_line(exc, 200)}") from None
    # The decoder only stops at the interpreter's recursion limit; what it accepted below that
    # must still be shallow enough to store and to serialise again anywhere.
    if _depth_over(payload, limits.MAX_DEPTH):
        raise DiscoveryError(too_deep)
    return payload


def parse_discovery(body: bytes | str) -> DiscoveryResult:
    """Parse a `/v1/rl/workers` body. Raises DiscoveryError / ProtocolVersionError only.

    A plainly well-formed listing takes the fast path (`discovery_fast`); anything else,
    including every payload or entry that is refused, is parsed here with its reasons.
    """
    well_formed = parse_well_formed(body, max_bytes=MAX_DISCOVERY_BYTES)
    if well_formed is not None:
        return well_formed
    return _parse_detailed(body)


def _parse_detailed(body: bytes | str) -> DiscoveryResult:
    payload = _load_json(body)
    if not isinstance(payload, dict):
        raise DiscoveryError(
            f"discovery payload must be a JSON object, got {type(payload).__name__}"
        )
    if isinstance(payload, RepeatedKeys):
        raise DiscoveryError(
            f"discovery payload repeats the key {one_line(repr(payload.repeated[0]), 60)}"
        )
    # The version gates everything else: a future layout must not be half-understood.
    if "protocol_version" not in payload:
        raise ProtocolVersionError("discovery payload has no 'protocol_version'")
    version = payload["protocol_version"]
    if not _is_int(version) or version not in SUPPORTED_PROTOCOL_VERSIONS:
        raise ProtocolVersionError(
            f"unsupported discovery protocol_version {one_line(repr(version), 60)}; "
            f"this client understands {sorted(SUPPORTED_PROTOCOL_VERSIONS)}",
            version,
        )
    namespace = payload.get("namespace")
    if not isinstance(namespace, str):
        raise DiscoveryError("discovery payload 'namespace' must be a string")
    if problem := limits.text_problem(namespace, limits.NAME_MAX):
        raise DiscoveryError(f"discovery payload 'namespace' {problem}")
    entries = payload.get("workers")
    if not isinstance(entries, list):
        raise DiscoveryError("discovery payload 'workers' must be an array")
    if len(entries) > limits.MAX_ENTRIES:
        raise DiscoveryError(
            f"discovery payload lists {len(entries)} workers, over the {limits.MAX_ENTRIES} limit"
        )

    workers: list[DiscoveredWorker] = []
    rejected: list[RejectedEntry] = []
    seen: set[WorkerIdentity] = set()
    for index, entry in enumerate(entries):
        try:
            worker = parse_worker(entry)
        except _EntryError as exc:
            rejected.append(_rejected(index, str(exc), entry))
            continue
        if worker.identity in seen:
            # The listener deduplicates on identity; a repeat means the payload is not its own.
            rejected.append(_rejected(index, f"duplicate worker {worker.key}", entry))
            continue
        seen.add(worker.identity)
        workers.append(worker)
    return DiscoveryResult(int(version), namespace, tuple(workers), tuple(rejected))


def _rejected(index: int, reason: str, entry: object) -> RejectedEntry:
    reason = limits.storable_text(one_line(reason, limits.REASON_MAX), limits.REASON_MAX)
    return RejectedEntry(index, reason, limits.raw_preview(entry))


def discovery_url(listener_url: str) -> str:
    return listener_url.rstrip("/") + DISCOVERY_PATH


def _error_message(raw: bytes | None) -> str | None:
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return limits.storable_text(one_line(raw.decode("utf-8", "replace"), 200))
    if isinstance(data, dict):
        message = data.get("message")
        if isinstance(message, str):
            return limits.storable_text(one_line(message, 300))
        if isinstance(data.get("error"), str):
            return limits.storable_text(one_line(data["error"], 300))
    return None


async def fetch_discovery(
    client: DynamoClient,
    policy: OutboundPolicy,
    listener_url: str,
    *,
    timeout: float,
) -> DiscoveryResult:
    """GET `{listener_url}/v1/rl/workers` and parse it.

    `timeout` bounds the whole exchange. The listener waits for its slowest probe
    (`DYN_RL_REQUEST_TIMEOUT_SECS`, default 30 s), so callers should pass more than that.
    Every failure — policy, transport, HTTP status, size, payload — raises DiscoveryError.
    """
    url = discovery_url(listener_url)
    problem = await policy.aviolation(url)
    if problem is not None:
        raise DiscoveryError(f"outbound policy: {problem}")
    try:
        reply = await client.send(
            "GET",
            url,
            timeout=timeout,
            limit=MAX_DISCOVERY_BYTES,
            error_limit=MAX_ERROR_BODY_BYTES,
            accept="application/json",
        )
    except CallTimeout:
        raise DiscoveryError(f"listener timed out after {timeout:g}s") from None
    except ProtocolError as exc:
        raise DiscoveryError(f"listener reply is not HTTP: {exc.reason}") from None
    except TransportError as exc:
        raise DiscoveryError(f"listener unreachable: {exc.reason}") from None
    status, raw = reply.status, reply.raw
    if 300 <= status < 400:
        location = reply.headers.get("location", "")
        raise DiscoveryError(
            f"listener answered HTTP {status} redirect to {location!r}; redirects are not followed"
        )
    if status != 200:
        message = _error_message(raw)
        if status == 500 and raw and b"discovery_failed" in raw:
            raise DiscoveryError(f"listener discovery failed: {message or 'no message'}")
        suffix = f": {message}" if message else ""
        raise DiscoveryError(f"listener answered HTTP {status}{suffix}")
    if raw is None:
        raise DiscoveryError(f"discovery payload exceeds the {MAX_DISCOVERY_BYTES}-byte limit")
    return parse_discovery(raw)
