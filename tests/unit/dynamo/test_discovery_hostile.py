"""Hostile discovery payloads: whatever the listener (or something pretending to be it) sends,
`parse_discovery` either raises `DiscoveryError` or returns entries that fit the database.

Payloads are generated around the contract's shape (§1.2, §1.3) with hostile leaves: NUL, lone
surrogates, control and bidi characters, strings at and past every column limit, NaN/Infinity
and out-of-range numbers as raw JSON text, wrong types, deep nesting, repeated keys, ids past
u64, and broken encodings. The storage check here is written independently of the parser's
own (`storable` below), against the limits the columns are built from.

The strategies are shared with tests/integration/fleet/test_discovery_storage.py, which stores
generated payloads through a real refresh on PostgreSQL.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import given as hypothesis_given
from hypothesis import strategies as st

from controlplane.dynamo import limits
from controlplane.dynamo.discovery import parse_discovery
from controlplane.dynamo.errors import DiscoveryError
from tests.conftest import examples

U64_MAX = 2**64 - 1

# ---- raw JSON text, so the generator can write what json.dumps cannot -----------------------


@dataclass(frozen=True)
class Raw:
    """A JSON token written verbatim (NaN, 1e400, deep brackets, broken text)."""

    text: str


@dataclass(frozen=True)
class Pairs:
    """A JSON object written from pairs, so keys can repeat."""

    items: tuple[tuple[str, Any], ...]


def to_json(value: Any, ascii_only: bool) -> str:
    """Serialise a generated value; floats keep Python's NaN/Infinity spellings on purpose."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Pairs):
        return "{" + ",".join(_pair(k, v, ascii_only) for k, v in value.items) + "}"
    if isinstance(value, dict):
        return "{" + ",".join(_pair(k, v, ascii_only) for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(to_json(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def _pair(key: str, value: Any, ascii_only: bool) -> str:
    return json.dumps(key, ensure_ascii=ascii_only) + ":" + to_json(value, ascii_only)


# ---- hostile leaves ---------------------------------------------------------------------------
# Leaves come from fixed tables drawn by index: each payload costs Hypothesis a dozen or two
# draws, which is what lets a CI run afford 50,000 of them.

#: Lengths at and around every limit a string can meet.
BOUNDARY_LENGTHS = sorted(
    {
        n + d
        for n in (
            limits.NAME_MAX,
            limits.URL_MAX,
            limits.MODEL_MAX,
            limits.ROUTE_MAX,
            limits.REQUEST_PLANE_URL_MAX,
            limits.WORKER_ERROR_MAX,
            limits.TRANSPORT_JSON_MAX,
        )
        for d in (-1, 0, 1)
    }
    | {100_000}
)
SPECIAL_TEXT = [
    "\x00",
    "a\x00b",
    "\x00" * 3,
    "\ud800",  # a lone surrogate (written as \\ud800 in ASCII JSON, raw in UTF-8 "surrogatepass")
    "x\udfffy",
    "\u202eevil\u202c",  # bidi override
    "\u2066\u2069",
    "\x1b[31mred\x1b[0m",
    "\x07\x08\x7f",
    "\x85\x9f",  # C1 controls
    "\ufeff",
    "\uffff\ufffe",
    "line\nbreak\r\ttab",
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "javascript:alert(1)",
    "\U0001f600" * 3,
    "é" * 5,
    " ",
    "",
    "rl",
    "get_weight_version",
]
LONG_TEXT = [
    (fill * n)[:n]
    for n in BOUNDARY_LENGTHS
    for fill in ("a", "é", "\U0001f600", "ab\u202e")
    if n < 100_000 or fill == "a"
] + ["a" * (limits.NAME_MAX - 1) + "\x00", "\x00" + "a" * limits.URL_MAX]
INTS = [0, 1, -1, 7, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63, -(2**63), U64_MAX, U64_MAX + 1]
INTS += [-(2**64), 2**70, 10**39, 10**40 - 1]  # 40 digits is the most a number may have
FLOATS = [1.0, -0.0, 2.5, 1e300, 5e-324]
OTHER = [None, True, False, [], {}, [1, "a"], {"a": "\x00"}, {"\x00": 1}, ["\x00"], {"tcp": 1}]
#: Leaves an entry may be refused for; none of them makes the whole payload unusable.
ENTRY_LEAVES: list[Any] = [*SPECIAL_TEXT, *LONG_TEXT, *INTS, *FLOATS, *OTHER]
ENTRY_LEAVES += [
    Raw(t)
    for t in (
        "1e-400",
        "-0",
        "0.0",
        "18446744073709551616",
        "18446744073709551615",
        '"\\u0000"',
        '"\\ud800"',
        '"\\udc00\\ud800"',
        '"\\ud83d\\ude00"',
        "[" * (limits.MAX_DEPTH - 4) + "]" * (limits.MAX_DEPTH - 4),
    )
]
ENTRY_LEAVES += [
    Pairs((("tcp", "a"), ("tcp", "b"))),  # a key twice
    Pairs((("a", "\x00"), ("a", "ok"))),
    ["x"] * limits.ROUTES_MAX,
    ["x"] * (limits.ROUTES_MAX + 1),
    ["r", "r" * (limits.ROUTE_MAX + 1)],
    {"tcp": "x" * limits.TRANSPORT_JSON_MAX},
    {"tcp": {"nested": ["ok", 1, None]}},
    *("http://127.0.0.1:9/" + t for t in SPECIAL_TEXT[:10]),
    "http://127.0.0.1:9/" + "a" * limits.URL_MAX,
    "http://u:p@127.0.0.1:9/",
    "http://[::1",
]
#: Leaves that make the whole document untrustworthy: NaN/Infinity, numbers out of range,
#: nesting past the limit, numbers too long to read.
PAYLOAD_LEAVES: list[Any] = [
    *(Raw(t) for t in ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E999")),
    math.nan,  # json.dumps writes NaN, Infinity and -Infinity for these
    math.inf,
    -math.inf,
    10**40,
    -(10**41),
    Raw("1" * 5000),  # past Python's own int parsing limit
    *(Raw("[" * n + "]" * n) for n in (limits.MAX_DEPTH + 1, 200, 2000)),
    Raw('{"a":' * (limits.MAX_DEPTH + 1) + "1" + "}" * (limits.MAX_DEPTH + 1)),
    Raw("[" * 100_000),
]
#: Broken tokens: the text stops being JSON.
BROKEN = [Raw(t) for t in ("nan", "undefined", "'single'", "[1,]", '{"a"}', "\x00", "")]

# ---- entries and payloads around the contract's shape ---------------------------------------

FIELDS = [
    "namespace",
    "component",
    "endpoint",
    "instance_id",
    "transport",
    "request_plane_url",
    "routes",
    "system_url",
    "admin_base_url",
    "model",
    "world_size",
    "error",
]
NAMES = ["rl-a", "backend", "dynamo", "é-ns", "\u202ens", "a" * limits.NAME_MAX, "x\x1by"]
ROUTES = [[], ["get_weight_version"], ["get_weight_version", "liveness_probe", "x"]]


#: How often each branch of the generators was drawn in this process, by (table, index). The
#: properties run a bounded number of examples per CI run; `assert_covered` checks that the
#: count reached every branch that matters instead of assuming it.
DRAWN: Counter = Counter()


def drawn(table: str, index: int) -> int:
    DRAWN[table, index] += 1
    return index


def pick(table: list[Any], label: str) -> st.SearchStrategy[Any]:
    """One item of a table, drawn by index (cheap to draw, and Hypothesis never has to print a
    table holding 100,000-character strings to label the strategy); counted in DRAWN."""
    return st.integers(0, len(table) - 1).map(lambda i: table[drawn(label, i)])


def branches(snapshot: Counter, **tables: int) -> dict[str, list[int]]:
    """Indexes of each named table (of the given size) not drawn since `snapshot`."""
    return {
        label: missed
        for label, size in tables.items()
        if (missed := [i for i in range(size) if DRAWN[label, i] <= snapshot[label, i]])
    }


leaf = pick(ENTRY_LEAVES, "leaf")
payload_leaf = pick(PAYLOAD_LEAVES, "payload_leaf")
name = pick(NAMES, "name")
#: What one mutation does to which field, as one draw.
MUTATIONS = [(a, f) for a in ("set", "set", "set", "drop", "unknown", "repeat") for f in FIELDS]
mutation = pick(MUTATIONS, "mutation")
ODD_VERSIONS = [2, "1", 1.0, None, True]
odd_versions = pick(ODD_VERSIONS, "odd_version")
JUNK = [*BROKEN, *PAYLOAD_LEAVES, *ENTRY_LEAVES[:40]]
junk = pick(JUNK, "junk")
#: Payload shapes (`hostile_payload`: 0-8 special, 9 the plain document) and body damage
#: (`hostile_body`: 0-3 special, 4 none).
PAYLOAD_KINDS, DAMAGES = 10, 5


@st.composite
def valid_entry(draw) -> dict[str, Any]:
    ns, component = draw(name), draw(name)
    optional = draw(st.integers(0, 15))  # which optional fields are present
    entry: dict[str, Any] = {
        "namespace": ns,
        "component": component,
        "endpoint": "rl",
        "instance_id": draw(st.integers(min_value=0, max_value=U64_MAX)),
        "transport": {"tcp": f"127.0.0.1:34047/e4ca/{ns}/{component}/rl"},
        "request_plane_url": f"dyn://{ns}.{component}.rl",
        "routes": ROUTES[optional % 3],
    }
    if optional & 1:
        entry["system_url"] = "http://127.0.0.1:9090"
        entry["world_size"] = 2**32 - 1 if optional & 8 else 1
    if optional & 2:
        entry["admin_base_url"] = "http://127.0.0.1:8000/"
        entry.setdefault("world_size", 4)
    if optional & 4:
        entry["model"] = "Qwen/Qwen3-0.6B"
    if optional == 15:
        entry["error"] = "worker discovery timed out after 30s"
    return entry


def _hostile_entry(draw, leaves) -> Any:
    entry: Any = draw(valid_entries)
    for _ in range(draw(st.integers(1, 3))):
        action, field = draw(mutation)
        value = draw(leaves)
        if action == "set":
            entry[field] = value
        elif action == "drop":
            entry.pop(field, None)
        elif action == "unknown":
            entry["future_" + field] = value  # unknown keys are ignored, whatever they hold
        else:  # the same key twice: the valid value and a hostile one, in either order
            pair = [(field, entry.get(field, "x")), (field, value)]
            items = [(k, v) for k, v in entry.items() if k != field]
            return Pairs(tuple(items + (pair if len(items) % 2 else pair[::-1])))
    return entry


valid_entries = valid_entry()
hostile_entries = st.composite(lambda draw: _hostile_entry(draw, leaf))()
#: Entries holding a payload-wide problem (NaN, deep nesting, a 41-digit number).
poisoned_entries = st.composite(lambda draw: _hostile_entry(draw, payload_leaf))()
any_entry = st.one_of(valid_entries, hostile_entries, leaf)


@st.composite
def hostile_payload(draw) -> Any:
    """A document around the contract's shape; mostly entry-level trouble, sometimes
    payload-wide (NaN, deep nesting, huge numbers), a repeated top-level key, or junk."""
    kind = draw(st.integers(0, 23))
    drawn("kind", min(kind, PAYLOAD_KINDS - 1))
    first = poisoned_entries if kind == 0 else hostile_entries
    workers = [draw(first) if draw(st.booleans()) or kind == 0 else draw(valid_entries)]
    for _ in range(draw(st.integers(0, 2))):
        workers.append(draw(any_entry))
    if kind == 1:
        workers.append(workers[0])  # the same worker twice
    doc: dict[str, Any] = {"protocol_version": 1, "namespace": "rl", "workers": workers}
    if kind == 2:
        doc["protocol_version"] = draw(odd_versions)
    elif kind == 3:
        doc["namespace"] = draw(leaf)
    elif kind == 4:
        doc["workers"] = draw(leaf)
    elif kind == 5:
        doc["future"] = draw(leaf)  # unknown top-level key
    elif kind == 6:
        return Pairs((*doc.items(), ("namespace", "other")))  # a top-level key twice
    elif kind == 7:
        doc.pop(["protocol_version", "namespace", "workers"][draw(st.integers(0, 2))])
    elif kind == 8:
        return draw(junk)
    return doc


hostile_payloads = hostile_payload()


@st.composite
def hostile_body(draw) -> bytes | str:
    """A payload as the bytes (or text) a listener would send, sometimes damaged on the way."""
    text = to_json(draw(hostile_payloads), ascii_only=draw(st.booleans()))
    damage = draw(st.integers(0, 19))
    drawn("damage", min(damage, DAMAGES - 1))
    if damage == 0 and text:
        return text[: len(text) // 2]  # cut off mid-stream
    if damage == 1:
        return text.encode("utf-8", "surrogatepass") + b"\xff"  # not UTF-8
    if damage == 2:
        return text.encode("utf-16", "surrogatepass")  # json.loads detects UTF-16
    if damage == 3:
        return text.encode("utf-8", "surrogatepass")  # lone surrogates as raw bytes
    return text.encode() if damage % 2 and text.isascii() else text


# ---- the storage check, written independently of the parser's --------------------------------


def storable(text: object, limit: int) -> bool:
    """What a PostgreSQL varchar(limit) / text column can hold."""
    if not isinstance(text, str) or "\x00" in text or len(text) > limit:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable_json(value: Any, limit: int) -> bool:
    """What a jsonb column can hold, in at most `limit` characters of compact JSON."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        return False
    if not storable(text, limit):
        return False
    # json.dumps writes a NUL as the escape \u0000, which jsonb refuses: look at the strings.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return False
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def assert_storable(result) -> None:
    for w in result.workers:
        ident = w.identity
        for text in (ident.namespace, ident.component, ident.endpoint):
            assert storable(text, limits.NAME_MAX) and text
        assert 0 <= ident.instance_id <= U64_MAX
        assert len(str(ident.instance_id)) <= limits.INSTANCE_ID_MAX
        assert storable(w.request_plane_url, limits.REQUEST_PLANE_URL_MAX)
        for url in (w.system_url, w.admin_base_url):
            assert url is None or storable(url, limits.URL_MAX)
        assert w.model is None or storable(w.model, limits.MODEL_MAX)
        assert w.error is None or storable(w.error, limits.WORKER_ERROR_MAX)
        assert w.world_size is None or 1 <= w.world_size <= 2**32 - 1
        assert isinstance(w.transport, dict) and w.transport
        assert storable_json(w.transport, limits.TRANSPORT_JSON_MAX)
        assert len(w.routes) <= limits.ROUTES_MAX
        assert all(storable(r, limits.ROUTE_MAX) and r for r in w.routes)
        assert storable_json(list(w.routes), 10**6)
    assert storable(result.namespace, limits.NAME_MAX)
    for r in result.rejected:
        assert storable(r.reason, limits.REASON_MAX) and "\n" not in r.reason
        # The raw value is kept either as it came (small, storable) or as a bounded text.
        if isinstance(r.raw, str):
            assert storable(r.raw, limits.RAW_PREVIEW_MAX)
        else:
            assert storable_json(r.raw, limits.RAW_PREVIEW_MAX)
    keys = [w.identity for w in result.workers]
    assert len(keys) == len(set(keys))


# ---- the properties ----------------------------------------------------------------------------

#: Generated examples per CI run (HYPOTHESIS_PROFILE=deep: the soak counts). Every table entry
#: is also exercised by the sweeps below in every run, so the random share explores
#: combinations; `branches` checks that it reached every payload shape and body damage.
EXAMPLES = {"payloads": examples(ci=3_000, deep=35_000), "entries": examples(1_500, 15_000)}


# ---- sweeps: every table entry in every run, whatever the random generation draws --------------


def sweep_entries() -> list[tuple[str, Any, Any]]:
    """(field, leaf, entry): every entry leaf set in every field of a valid entry; and, one
    field each in turn, the same key twice (valid then hostile) and an unknown key holding it."""
    cases: list[tuple[str, Any, Any]] = []
    for i, value in enumerate(ENTRY_LEAVES):
        for field in FIELDS:
            cases.append((field, value, _one(**{field: value})))
        field = FIELDS[i % len(FIELDS)]
        items = [(k, v) for k, v in _one().items() if k != field]
        cases.append(
            (field, value, Pairs((*items, (field, _one().get(field, "x")), (field, value))))
        )
        cases.append(("future_" + field, value, _one(**{"future_" + field: value})))
    return cases


def sweep_bodies() -> list[bytes | str]:
    """Whole documents: every payload-wide leaf in every field, every junk body, every odd
    protocol version, every entry leaf as the namespace and as the worker list, each body
    damage on a valid listing."""
    docs: list[Any] = [
        {"protocol_version": 1, "namespace": "rl", "workers": [_one(**{field: value})]}
        for value in PAYLOAD_LEAVES
        for field in FIELDS
    ]
    docs += JUNK
    docs += [{"protocol_version": v, "namespace": "rl", "workers": [_one()]} for v in ODD_VERSIONS]
    for value in ENTRY_LEAVES:
        docs.append({"protocol_version": 1, "namespace": value, "workers": [_one()]})
        docs.append({"protocol_version": 1, "namespace": "rl", "workers": value})
    bodies: list[bytes | str] = [to_json(d, ascii_only=i % 2 == 0) for i, d in enumerate(docs)]
    valid = _doc(_one(), _one(instance_id=8))
    bodies += [
        valid[: len(valid) // 2],
        valid.encode() + b"\xff",
        valid.encode("utf-16"),
        _doc(_one(component="\ud800")).encode("utf-8", "surrogatepass"),
    ]
    return bodies


def _check(body: bytes | str) -> str:
    """Parse one body; returns "refused" or "accepted". Anything else raised fails the test."""
    try:
        result = parse_discovery(body)
    except DiscoveryError as exc:
        assert storable(exc.reason, 500) and "\n" not in exc.reason and exc.reason
        return "refused"
    assert_storable(result)
    return "accepted"


def _run(strategy, examples: int, capsys) -> dict[str, int]:
    counts = {"refused": 0, "accepted": 0, "workers": 0}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,  # a fixed amount of fresh generation per run, not replays
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @hypothesis_given(strategy)
    def check(body):
        counts[_check(body)] += 1

    check()
    return counts


def test_hostile_payloads_are_refused_or_fit_storage(capsys):
    swept = Counter(_check(body) for body in sweep_bodies())
    before = DRAWN.copy()
    counts = _run(hostile_body(), EXAMPLES["payloads"], capsys)
    assert branches(before, kind=PAYLOAD_KINDS, damage=DAMAGES) == {}
    assert swept["refused"] > 0 and swept["accepted"] > 0
    with capsys.disabled():
        print(
            f"\n[hostile discovery] {counts['refused'] + counts['accepted']} payloads: "
            f"{counts['refused']} refused (DiscoveryError), {counts['accepted']} parsed, "
            f"0 crashes; swept {swept.total()} table bodies: {dict(swept)}"
        )
    # Both outcomes were exercised: a generator that only produced refusals proves little.
    assert counts["refused"] > 0 and counts["accepted"] > 0


@st.composite
def one_hostile_entry_body(draw) -> tuple[str, int]:
    """A well-formed payload around hostile entries (entry-level leaves only), so entry rules
    are what gets exercised."""
    entries = [draw(hostile_entries) for _ in range(draw(st.integers(1, 3)))]
    doc = {"protocol_version": 1, "namespace": "rl", "workers": entries}
    return to_json(doc, ascii_only=draw(st.booleans())), len(entries)


def _one_entry_accounted(body: str, entries: int) -> Any:
    try:
        result = parse_discovery(body)
    except DiscoveryError as exc:
        # Entry-level trouble never refuses the payload: the other workers still count.
        raise AssertionError(f"payload refused for an entry problem: {exc.reason}") from None
    assert_storable(result)
    # Every entry is accounted for exactly once: accepted or rejected with its reason.
    assert len(result.workers) + len(result.rejected) == entries
    assert all(r.reason for r in result.rejected)
    return result


def test_every_entry_leaf_in_every_field_is_rejected_with_a_reason_or_fits_storage():
    outcomes = Counter()
    for i, (_field, _value, entry) in enumerate(sweep_entries()):
        doc = {"protocol_version": 1, "namespace": "rl", "workers": [entry, _one(instance_id=8)]}
        result = _one_entry_accounted(to_json(doc, ascii_only=i % 2 == 0), 2)
        outcomes["rejected" if result.rejected else "accepted"] += 1
    assert outcomes["rejected"] > 0 and outcomes["accepted"] > 0


def test_hostile_entries_are_rejected_with_a_reason_or_fit_storage(capsys):
    outcomes = {"rejected": 0, "accepted": 0}
    before = DRAWN.copy()

    @settings(
        max_examples=EXAMPLES["entries"],
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @hypothesis_given(one_hostile_entry_body())
    def check(case):
        body, entries = case
        result = _one_entry_accounted(body, entries)
        outcomes["rejected"] += len(result.rejected)
        outcomes["accepted"] += len(result.workers)

    check()
    # Every mutation (action and field) was drawn; the leaves are swept above.
    assert branches(before, mutation=len(MUTATIONS)) == {}
    with capsys.disabled():
        print(
            f"\n[hostile discovery] {EXAMPLES['entries']} entry payloads: "
            f"{outcomes['accepted']} entries accepted, {outcomes['rejected']} rejected with a "
            "reason, 0 payloads refused, 0 crashes"
        )
    assert outcomes["rejected"] > 0 and outcomes["accepted"] > 0


# ---- the rules, one by one --------------------------------------------------------------------


def _doc(*entries: Any, namespace: Any = "rl") -> str:
    return to_json({"protocol_version": 1, "namespace": namespace, "workers": list(entries)}, False)


def _one(**overrides: Any) -> dict[str, Any]:
    entry = {
        "namespace": "rl-a",
        "component": "backend",
        "endpoint": "rl",
        "instance_id": 7,
        "transport": {"tcp": "127.0.0.1:1/t/rl-a/backend/rl"},
        "request_plane_url": "dyn://rl-a.backend.rl",
        "routes": ["get_weight_version"],
    }
    entry.update(overrides)
    return entry


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_doc(_one(world_size=Raw("NaN"))), "contains NaN, which JSON does not allow"),
        (_doc(_one(future=Raw("-Infinity"))), "contains -Infinity"),
        (_doc(_one(transport={"tcp": Raw("1e400")})), "number out of range (1e400)"),
        (_doc(_one(instance_id=Raw("9" * 41))), "41-digit number (over 40 digits)"),
        (_doc(_one(instance_id=Raw("9" * 5000))), "5000-digit number"),
        (_doc(_one(x=Raw("[" * 31 + "]" * 31))), "nested too deeply (over 32 levels)"),
        ("[" * 100_000, "nested too deeply"),
        (Pairs((("protocol_version", 1), ("namespace", "a"), ("namespace", "b"))), "repeats"),
        (_doc(namespace="a\x00"), "'namespace' contains a NUL character"),
        (_doc(namespace="\ud800"), "'namespace' contains a lone UTF-16 surrogate"),
        (_doc(*[1] * (limits.MAX_ENTRIES + 1)), "lists 50001 workers, over the 50000 limit"),
    ],
    ids=[
        "nan",
        "-inf-in-unknown-key",
        "1e400",
        "41-digits",
        "5000-digits",
        "depth-33",
        "100k-brackets",
        "repeated-top-level-key",
        "nul-namespace",
        "surrogate-namespace",
        "too-many-entries",
    ],
)
def test_payload_wide_problems_refuse_the_payload(body, reason):
    if isinstance(body, Pairs):
        body = to_json(Pairs((*body.items, ("workers", []))), False)
    with pytest.raises(DiscoveryError) as info:
        parse_discovery(body)
    assert reason in info.value.reason


def test_limits_are_inclusive_and_control_characters_are_data():
    at_limit = _one(
        component="c" * limits.NAME_MAX,
        model="\u202e\x1b\x85" + "m" * (limits.MODEL_MAX - 3),
        instance_id=Raw("1" + "0" * 19),  # 20 digits: within u64
        x=Raw("[" * 28 + "]" * 28),  # 32 levels with the payload's own four
        error="engine \x07 dead",
    )
    (worker,) = parse_discovery(_doc(at_limit)).workers
    assert worker.identity.component == "c" * limits.NAME_MAX
    assert worker.model.startswith("\u202e\x1b\x85") and worker.error == "engine \x07 dead"


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (_one(component="a\x00"), "'component' contains a NUL character"),
        (_one(model="x\udc00"), "'model' contains a lone UTF-16 surrogate"),
        (_one(endpoint="e" * 201), "'endpoint' is 201 characters long, over the 200-character"),
        (_one(routes=["r" * 201]), "'routes' has an entry that is 201 characters long"),
        (_one(routes=["r"] * 257), "'routes' has 257 entries, over the 256 limit"),
        (_one(transport={"tcp": "t" * 3000}), "'transport' has a string that is 3000 characters"),
        (_one(transport={"tcp": "a", "x": "b" * 2040}), "'transport' is 2058 characters as JSON"),
        (_one(transport=Pairs((("tcp", "a"), ("tcp", "b")))), "'transport' repeats the key 'tcp'"),
        (Pairs((*_one().items(), ("component", "other"))), "entry repeats the key 'component'"),
        (_one(instance_id=2**64), "outside the unsigned 64-bit range"),
        (_one(instance_id=-1), "outside the unsigned 64-bit range"),
        (_one(error="e" * 4097), "'error' is 4097 characters long, over the 4096-character"),
    ],
    ids=[
        "nul",
        "surrogate",
        "long-name",
        "long-route",
        "many-routes",
        "long-transport-string",
        "long-transport",
        "repeated-transport-key",
        "repeated-entry-key",
        "u64-overflow",
        "negative-id",
        "long-error",
    ],
)
def test_entry_problems_reject_only_that_entry(entry, reason):
    result = parse_discovery(_doc(_one(component="good"), entry))
    assert [w.identity.component for w in result.workers] == ["good"]
    (rejected,) = result.rejected
    assert rejected.index == 1 and reason in rejected.reason


def test_unknown_keys_are_ignored_even_when_they_hold_nul():
    (worker,) = parse_discovery(_doc(_one(future="\x00", **{"\x00": 1}))).workers
    assert worker.identity.component == "backend"
