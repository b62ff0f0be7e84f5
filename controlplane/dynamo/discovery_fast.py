"""The fast path of `discovery.parse_discovery`: a well-formed listing, checked with plain code.

A real listener sends thousands of entries of one shape: the contract's keys, strings, two
integers and a flat `transport`. The detailed validator (`discovery.parse_worker` and the hooked
JSON decoder) builds a precise reason for anything wrong, at ~30 µs an entry; this path checks
the same rules with type tests and string methods and gives up (`None`) on the first thing that
is not plainly fine — an unknown key, a null, a float, a non-ASCII text it would have to examine
further, a bad value, a duplicate worker — so the detailed validator parses that payload from
scratch and says why. It never accepts what the detailed validator refuses: every rule below is
one of its rules, or stricter.

Payload-wide rules without the decoder's hooks:

- *Repeated keys.* Plain `json.loads` keeps the last value of a repeated key. In a body without
  a backslash every `"` delimits a string, so the body's string count is `count('"') / 2`; the
  decoded document accounts for every key and string value it kept, and a repeated key loses a
  key (and its value) — the counts agree exactly when no key was repeated. A body with a
  backslash, or bytes not in UTF-8, is decoded with the hook instead.
- *NaN, Infinity, huge numbers, depth.* Only the shapes above are accepted, so any float (NaN,
  Infinity and 1e400 decode as floats) gives up, every integer is range-checked (so none has
  over 40 digits), and nothing nests deeper than four levels.
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import limits
from .listing import (
    SUPPORTED_PROTOCOL_VERSIONS,
    U32_MAX,
    U64_MAX,
    DiscoveredWorker,
    DiscoveryResult,
    WorkerIdentity,
    admin_base_url_problem,
    object_pairs,
    system_url_problem,
)

_TOP_KEYS = frozenset({"protocol_version", "namespace", "workers"})
_ENTRY_KEYS = frozenset(
    {
        "namespace",
        "component",
        "endpoint",
        "instance_id",
        "transport",
        "request_plane_url",
        "system_url",
        "admin_base_url",
        "model",
        "routes",
        "world_size",
        "error",
    }
)
_OPTIONAL_TEXT = (
    ("system_url", limits.URL_MAX),
    ("admin_base_url", limits.URL_MAX),
    ("model", limits.MODEL_MAX),
    ("error", limits.WORKER_ERROR_MAX),
)
#: Worst case of compact JSON per character (`\u001f`), for the transport size bound.
_JSON_CHAR_MAX = 6
#: The scheme and authority of a plain http(s) URL (what decides `system_url_problem`).
_ORIGIN = re.compile(r"https?://[^/?#]*")


class _GiveUp(Exception):
    """Not plainly well-formed: the detailed validator decides."""


def _text(value: object, limit: int, *, empty: bool = False) -> str:
    """`limits.text_problem` is None for `value`, a str (non-empty unless `empty`)."""
    if type(value) is not str or len(value) > limit or (not value and not empty):
        raise _GiveUp
    if "\x00" in value or (not value.isascii() and limits.text_problem(value, limit)):
        raise _GiveUp
    return value


class _Listing:
    """One fast parse: the verdicts it can share between entries."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, ...], tuple[str, ...]] = {}
        self.origins: dict[str, bool] = {}
        #: Keys and string values the decoded document holds (see the module docstring).
        self.keys = 0
        self.strings = 0

    def routes_of(self, value: object) -> tuple[str, ...]:
        if type(value) is not list:
            raise _GiveUp
        key = tuple(value)
        try:
            known = self.routes.get(key)
        except TypeError:  # an unhashable route (an object or array)
            raise _GiveUp from None
        if known is None:
            if len(key) > limits.ROUTES_MAX:
                raise _GiveUp
            if key:
                try:
                    joined = "\n".join(key)  # TypeError for any non-string route
                except TypeError:
                    raise _GiveUp from None
                if min(map(len, key)) == 0 or max(map(len, key)) > limits.ROUTE_MAX:
                    raise _GiveUp
                if "\x00" in joined:
                    raise _GiveUp
                if not joined.isascii():
                    for route in key:
                        _text(route, limits.ROUTE_MAX)
            known = self.routes[key] = key
        self.strings += len(known)
        return known

    def system_url_ok(self, url: str) -> bool:
        """`system_url_problem(url) is None`. For a printable ASCII URL starting with an http
        scheme its verdict depends only on the scheme and authority (query, fragment and
        userinfo are allowed), so it is judged once per origin."""
        if url.isascii() and url.isprintable() and " " not in url:
            origin = _ORIGIN.match(url)
            if origin is not None:
                key = origin.group()
                verdict = self.origins.get(key)
                if verdict is None:
                    verdict = self.origins[key] = system_url_problem(key) is None
                return verdict
        return system_url_problem(url) is None

    def transport_of(self, value: object) -> dict[str, Any]:
        if type(value) is not dict or not value:
            raise _GiveUp
        size = 2 * len(value) + 2  # the quotes and punctuation around each pair, roughly
        for key, item in value.items():
            _text(key, limits.TRANSPORT_JSON_MAX, empty=True)
            _text(item, limits.TRANSPORT_JSON_MAX, empty=True)
            size += len(key) + len(item) + 4
        if size * _JSON_CHAR_MAX > limits.TRANSPORT_JSON_MAX and limits.json_problem(
            value, max_chars=limits.TRANSPORT_JSON_MAX
        ):
            raise _GiveUp
        self.keys += len(value)
        self.strings += len(value)
        return value

    def worker(self, entry: object) -> DiscoveredWorker:
        if type(entry) is not dict or not entry.keys() <= _ENTRY_KEYS:
            raise _GiveUp
        get = entry.get
        instance_id = get("instance_id")
        if type(instance_id) is not int or not 0 <= instance_id <= U64_MAX:
            raise _GiveUp
        identity = WorkerIdentity(
            _text(get("namespace"), limits.NAME_MAX),
            _text(get("component"), limits.NAME_MAX),
            _text(get("endpoint"), limits.NAME_MAX),
            instance_id,
        )
        transport = self.transport_of(get("transport"))
        request_plane_url = _text(get("request_plane_url"), limits.REQUEST_PLANE_URL_MAX)
        routes = self.routes_of(get("routes"))
        optional: dict[str, Any] = {}
        for name, limit in _OPTIONAL_TEXT:
            if name in entry:  # present as null, or not a string: refused or explained there
                optional[name] = _text(entry[name], limit, empty=True)
        system_url = optional.get("system_url")
        if system_url is not None and not self.system_url_ok(system_url):
            raise _GiveUp
        admin_base_url = optional.get("admin_base_url")
        if admin_base_url is not None and admin_base_url_problem(admin_base_url):
            raise _GiveUp
        world_size = get("world_size")
        if "world_size" in entry and (type(world_size) is not int or not 0 < world_size <= U32_MAX):
            raise _GiveUp
        self.keys += len(entry)
        self.strings += 4 + len(optional)  # four required strings, plus the optional ones
        return DiscoveredWorker(
            identity,
            transport,
            request_plane_url,
            routes,
            system_url,
            admin_base_url,
            optional.get("model"),
            world_size,
            optional.get("error"),
        )


def parse_well_formed(body: bytes | str, *, max_bytes: int) -> DiscoveryResult | None:
    """The listing in `body` when it is plainly well-formed (every entry accepted), else None
    (anything else, including any entry the detailed validator would reject, or a body over
    `max_bytes`, which the detailed validator refuses with its reason)."""
    # Every character is at most 4 bytes of UTF-8: a str under this is under the byte limit.
    size = len(body) if isinstance(body, bytes) else 4 * len(body)
    if size > max_bytes:
        return None
    if isinstance(body, bytes):
        # Counting quote bytes is counting quotes only in UTF-8 (in UTF-16 or UTF-32, which
        # json.loads also reads, other characters contain the byte 0x22).
        utf8 = json.detect_encoding(body) in ("utf-8", "utf-8-sig")
        quotes = body.count(b'"') if utf8 and b"\\" not in body else None
    else:
        quotes = body.count('"') if "\\" not in body else None
    counted = quotes is not None
    try:
        payload = json.loads(body) if counted else json.loads(body, object_pairs_hook=object_pairs)
    except (ValueError, TypeError, RecursionError):
        return None
    try:
        result, listing = _payload(payload)
    except _GiveUp:
        return None
    if quotes is not None and quotes != 2 * (listing.keys + listing.strings):
        return None  # a repeated key somewhere
    return result


def _payload(payload: object) -> tuple[DiscoveryResult, _Listing]:
    if type(payload) is not dict or not payload.keys() <= _TOP_KEYS:
        raise _GiveUp
    version = payload.get("protocol_version")
    if type(version) is not int or version not in SUPPORTED_PROTOCOL_VERSIONS:
        raise _GiveUp
    namespace = _text(payload.get("namespace"), limits.NAME_MAX, empty=True)
    entries = payload.get("workers")
    if type(entries) is not list or len(entries) > limits.MAX_ENTRIES:
        raise _GiveUp
    listing = _Listing()
    listing.keys, listing.strings = len(payload), 1
    workers = [listing.worker(entry) for entry in entries]
    # The listener deduplicates on identity; a repeat is explained by the detailed validator.
    if len({w.identity for w in workers}) != len(workers):
        raise _GiveUp
    return DiscoveryResult(version, namespace, tuple(workers), ()), listing
