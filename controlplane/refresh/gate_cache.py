"""The gates' public state, copied to Redis so the gate API answers without reading the row.

`refresh.gates` (the only writer of gate rows) stores a gate's serialisation here, read from
the committed row, when the transaction that bumped its revision (or moved `confirmed_at`)
commits, before the live push: readers never see a state that was rolled back. The gate API
reads the copy; on a miss it serialises the row from the database and primes the copy
(`prime`).

A copy is a hint, never the truth. Before any answer is given from it, its revision is checked
against the revision the gate row has in PostgreSQL now (`committed_revisions`, one indexed
read; the fast path shares one read among every poll that arrived while the previous one was
in flight, `intake.api.fast_gate`). Every writer bumps `Gate.revision` in the transaction that
changes what the gate answers, so the row's revision moves exactly when the change commits. A
copy at another revision, or a check that cannot be made (the database away), is not used:
the answer comes from the row. So no reader is told "open", or an old admitted set, once a
close has committed, whatever Redis did: down while the writer tried to store (the old copy
survives), flushed (a slow reader primes the old state back past the compare-and-set), or a
writer configured with another Redis (a `manage.py` command with its own REDIS_URL stores its
copy where the web process never looks). Why not a revision epoch in Redis, or LISTEN/NOTIFY:
docs/decisions/2026-12-04-gate-copies-validated.md.

The copy also shows the namespace's policy lag (`policy_lag.with_lag`), which moves when the
trainer publishes a policy, not with the gate's revision: each copy carries the source's
policy mark (its newest published policy) and is current only while that mark is too; the
ETag names both.

One value per gate, `"<revision> <source id> <refresh at, ms> <policy mark> <JSON>"`: the
numbers come first so an `If-None-Match` poll is answered (and a source-limited token refused)
without parsing the JSON. Writes are compare-and-set on the revision, in one Lua script: a
reader that loaded revision 7 from the database and primes after the writer stored revision 8
changes nothing, whatever the order the two reach Redis in.

The copy also expires after `TTL_SECONDS`. Its answer also shows its source's name and, for an
`unknown` gate, the source's staleness, which change elsewhere without a revision; and a write
that failed (Redis briefly away at commit) should not cost a database answer per poll for
long. Rebuilding a gate's copy every few seconds costs a few queries, not a few per poll: once
a copy is `REFRESH_AHEAD_SECONDS` from lapsing, one reader per process rebuilds it from the
database while the others go on reading it, so a polled gate never lapses into a burst of
misses.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from django.db import DatabaseError, connection

from controlplane import dbretry, redis_client
from controlplane.fleet.models import PublishedPolicy, Source
from controlplane.refresh.models import Gate
from controlplane.refresh.policy_lag import with_lag, with_lags_of

logger = logging.getLogger(__name__)

TTL_SECONDS = 10
REFRESH_AHEAD_SECONDS = 2

# KEYS[1] the gate; ARGV: revision, value, TTL. An equal revision is replaced: it differs at
# most in `confirmed_at`, which moves without a revision.
_STORE_IF_NOT_OLDER = """
local current = redis.call('GET', KEYS[1])
if current then
  local stored = tonumber(string.match(current, '^(%d+) '))
  if stored and stored > tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
return 1
"""


@dataclass(frozen=True)
class CachedGate:
    """One gate's copy: `body` is `serialize_gate`'s JSON, as bytes."""

    revision: int
    source_id: int
    #: When one reader should rebuild it from the database (seconds since the epoch).
    refresh_at: float
    #: The source's policy mark the copy's lag was computed at (`policy_lag.policy_mark`).
    mark: int
    body: bytes

    def due(self, now: float) -> bool:
        return self.refresh_at <= now

    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


def gate_key(source_name: str, namespace: str) -> str:
    # Source names are slugs (no ":"), so the split between source and namespace is unambiguous.
    return redis_client.key("gate", source_name, namespace)


def encode(payload: Mapping[str, Any], source_id: int) -> bytes:
    """`payload` is a gate with its lag (`policy_lag.with_lag`)."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    refresh_at_ms = int((time.time() + TTL_SECONDS - REFRESH_AHEAD_SECONDS) * 1000)
    mark = int(payload.get("policy_mark") or 0)
    return f"{int(payload['revision'])} {int(source_id)} {refresh_at_ms} {mark} {body}".encode()


def decode(raw: bytes | str | None) -> CachedGate | None:
    """The copy in `raw`, or None for a missing or unreadable value (read as a miss)."""
    if not raw:
        return None
    if isinstance(raw, str):
        raw = raw.encode()
    parts = raw.split(b" ", 4)
    if len(parts) != 5:
        return None
    revision, source_id, refresh_at_ms, mark, body = parts
    if not (
        revision.isdigit()
        and source_id.isdigit()
        and refresh_at_ms.isdigit()
        and mark.isdigit()
        and body.startswith(b"{")
    ):
        return None
    return CachedGate(int(revision), int(source_id), int(refresh_at_ms) / 1000, int(mark), body)


def read(source_name: str, namespace: str) -> CachedGate | None:
    try:
        raw = redis_client.sync_client().get(gate_key(source_name, namespace))
    except redis.RedisError:
        logger.warning("gate copy unreadable; answering from the database", exc_info=True)
        return None
    return decode(raw)


def _store(payload: Mapping[str, Any], source_id: int) -> bool:
    """Write `payload` (with its lag: read here when it has none) unless a newer revision is
    stored."""
    if "policy_mark" not in payload:
        payload = with_lag(payload)
    client = redis_client.sync_client()
    key = gate_key(str(payload["source"]), str(payload["namespace"]))
    revision, value = int(payload["revision"]), encode(payload, source_id)
    return bool(client.eval(_STORE_IF_NOT_OLDER, 1, key, revision, value, TTL_SECONDS))


def store(payloads: Iterable[Mapping[str, Any]]) -> None:
    """Store committed gates (`serialize_gate` payloads), with their lag read once per source
    for all its gates (a refresh's close and reopen change every namespace of its scope).
    Never raises, since it runs after commit: a copy that cannot be written is deleted if
    possible, and lapses within `TTL_SECONDS` otherwise."""
    by_source: dict[int, list[Mapping[str, Any]]] = {}
    for payload in payloads:
        by_source.setdefault(int(payload["source_id"]), []).append(payload)
    for source_id, group in by_source.items():
        try:
            lagged = with_lags_of(Source.objects.get(pk=source_id), group)
        except (DatabaseError, Source.DoesNotExist) as exc:
            _not_written(group, exc)
            continue
        for payload in lagged:
            try:
                _store(payload, source_id)
            except redis.RedisError as exc:
                _not_written([payload], exc)


def _not_written(payloads: Sequence[Mapping[str, Any]], exc: Exception) -> None:
    for payload in payloads:
        key = gate_key(str(payload["source"]), str(payload["namespace"]))
        logger.warning("gate copy %s not written", key, exc_info=exc)
        with contextlib.suppress(redis.RedisError):
            redis_client.sync_client().delete(key)
    if isinstance(exc, DatabaseError) and not dbretry.in_transaction():
        # The lag read met a dropped connection after the caller's commit: drop it here, or
        # the caller's next statement (an executor's fenced step) fails on it.
        dbretry.reconnect()


def prime(payload: Mapping[str, Any], source_id: int) -> None:
    """A reader's copy of what it just read from the database: written only where no newer
    revision is stored. Best effort, like every read-side write."""
    try:
        _store(payload, source_id)
    except redis.RedisError:
        logger.warning("gate copy not primed", exc_info=True)


#: A gate's scope as the API names it: (source name, namespace).
Scope = tuple[str, str]
#: What a copy must match to be current: (gate revision, the source's policy mark).
Committed = tuple[int, int]


def committed_revisions(scopes: Iterable[Scope]) -> dict[Scope, Committed]:
    """Each gate's revision in the database now (0 for a namespace without a gate row:
    `gates.gate_state` answers those at revision 0) and its source's policy mark. One query
    for any number of gates with rows, a second only for scopes without one; raises the
    database's error when it cannot be read (the caller then uses no copy).

    Plain SQL on the polls' hot path: building the equivalent queryset cost more CPU than the
    rest of a poll. The same statements serve the web process's own reader connection
    (`intake/api/gate_revisions.py`), through `revisions_query` and `collect_revisions`."""
    wanted = set(scopes)
    if not wanted:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(*revisions_query(wanted))
        found, missing = collect_revisions(wanted, cursor.fetchall())
        if missing:
            cursor.execute(*marks_query(missing))
            add_marks(wanted, found, cursor.fetchall())
    return found


def revisions_query(wanted: set[Scope]) -> tuple[str, list[str]]:
    names = sorted({s for s, _ in wanted})
    namespaces = sorted({n for _, n in wanted})
    return _revisions_sql(len(names), len(namespaces)), [*names, *namespaces]


def collect_revisions(
    wanted: set[Scope], rows: Iterable[Sequence[Any]]
) -> tuple[dict[Scope, Committed], list[str]]:
    """The revisions found for `wanted`, and the sources of the scopes without a gate row."""
    found: dict[Scope, Committed] = {}
    for source, namespace, revision, mark in rows:
        if (source, namespace) in wanted:
            found[(source, namespace)] = (int(revision), int(mark or 0))
    return found, sorted({s for s, n in wanted if (s, n) not in found})


def marks_query(missing: list[str]) -> tuple[str, list[str]]:
    return _marks_sql(len(missing)), missing


def add_marks(
    wanted: set[Scope], found: dict[Scope, Committed], rows: Iterable[Sequence[Any]]
) -> None:
    marks = {name: int(mark or 0) for name, mark in rows}
    for scope in wanted - found.keys():
        found[scope] = (0, marks.get(scope[0], 0))


@functools.lru_cache(maxsize=64)
def _revisions_sql(names: int, namespaces: int) -> str:
    gate, source = Gate._meta.db_table, Source._meta.db_table
    policy = PublishedPolicy._meta.db_table
    return (
        f"SELECT s.name, g.namespace, g.revision, (SELECT p.id FROM {policy} p"
        f" WHERE p.source_id = g.source_id ORDER BY p.id DESC LIMIT 1)"
        f" FROM {gate} g JOIN {source} s ON s.id = g.source_id"
        f" WHERE s.name IN ({_marks(names)}) AND g.namespace IN ({_marks(namespaces)})"
    )


@functools.lru_cache(maxsize=64)
def _marks_sql(names: int) -> str:
    source, policy = Source._meta.db_table, PublishedPolicy._meta.db_table
    return (
        f"SELECT s.name, (SELECT p.id FROM {policy} p WHERE p.source_id = s.id"
        f" ORDER BY p.id DESC LIMIT 1) FROM {source} s WHERE s.name IN ({_marks(names)})"
    )


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


def is_current(cached: CachedGate, committed: Committed | None) -> bool:
    return committed is not None and committed == (cached.revision, cached.mark)


def current(cached: CachedGate | None, source_name: str, namespace: str) -> CachedGate | None:
    """`cached` if it is what the database has committed now, else None (a miss).

    One indexed read; a database that cannot be read also gives None, so no answer comes from
    a copy nobody could check."""
    if cached is None:
        return None
    try:
        committed = committed_revisions([(source_name, namespace)])[(source_name, namespace)]
    except DatabaseError:
        logger.warning("gate revision unreadable; not answering from the copy", exc_info=True)
        return None
    return cached if is_current(cached, committed) else None
