"""The gates' public state, copied to Redis so the gate API answers without the database.

`refresh.gates` (the only writer of gate rows) stores a gate's serialisation here, read from
the committed row, when the transaction that bumped its revision (or moved `confirmed_at`)
commits, before the live push: readers never see a state that was rolled back. The gate API
reads the copy; on a miss it serialises the row from the database and primes the copy
(`prime`).

One value per gate, `"<revision> <source id> <refresh at, ms> <serialize_gate JSON>"`: the
numbers come first so an `If-None-Match` poll is answered (and a source-limited token refused)
without parsing the JSON. Writes are compare-and-set on the revision, in one Lua script: a
reader that loaded revision 7 from the database and primes after the writer stored revision 8
changes nothing, whatever the order the two reach Redis in.

The copy also expires after `TTL_SECONDS`. The gate's own changes all come through here, but
its answer also shows its source's name and, for an `unknown` gate, the source's staleness,
which change elsewhere; and a write that failed (Redis briefly away at commit) must not leave a
stale gate behind for long. Rebuilding a gate's copy every few seconds costs a few queries,
not a few per poll: once a copy is `REFRESH_AHEAD_SECONDS` from lapsing, one reader per
process rebuilds it from the database while the others go on reading it, so a polled gate
never lapses into a burst of misses.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from controlplane import redis_client

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
    body: bytes

    def due(self, now: float) -> bool:
        return self.refresh_at <= now

    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


def gate_key(source_name: str, namespace: str) -> str:
    # Source names are slugs (no ":"), so the split between source and namespace is unambiguous.
    return redis_client.key("gate", source_name, namespace)


def encode(payload: Mapping[str, Any], source_id: int) -> bytes:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    refresh_at_ms = int((time.time() + TTL_SECONDS - REFRESH_AHEAD_SECONDS) * 1000)
    return f"{int(payload['revision'])} {int(source_id)} {refresh_at_ms} {body}".encode()


def decode(raw: bytes | str | None) -> CachedGate | None:
    """The copy in `raw`, or None for a missing or unreadable value (read as a miss)."""
    if not raw:
        return None
    if isinstance(raw, str):
        raw = raw.encode()
    parts = raw.split(b" ", 3)
    if len(parts) != 4:
        return None
    revision, source_id, refresh_at_ms, body = parts
    if not (
        revision.isdigit()
        and source_id.isdigit()
        and refresh_at_ms.isdigit()
        and body.startswith(b"{")
    ):
        return None
    return CachedGate(int(revision), int(source_id), int(refresh_at_ms) / 1000, body)


def read(source_name: str, namespace: str) -> CachedGate | None:
    try:
        raw = redis_client.sync_client().get(gate_key(source_name, namespace))
    except redis.RedisError:
        logger.warning("gate copy unreadable; answering from the database", exc_info=True)
        return None
    return decode(raw)


def _store(payload: Mapping[str, Any], source_id: int) -> bool:
    client = redis_client.sync_client()
    key = gate_key(str(payload["source"]), str(payload["namespace"]))
    revision, value = int(payload["revision"]), encode(payload, source_id)
    return bool(client.eval(_STORE_IF_NOT_OLDER, 1, key, revision, value, TTL_SECONDS))


def store(payloads: Iterable[Mapping[str, Any]]) -> None:
    """Store committed gates (`serialize_gate` payloads). Never raises, since it runs after
    commit: a copy that cannot be written is deleted if possible, and lapses within
    `TTL_SECONDS` otherwise."""
    for payload in payloads:
        try:
            _store(payload, int(payload["source_id"]))
        except redis.RedisError:
            key = gate_key(str(payload["source"]), str(payload["namespace"]))
            logger.warning("gate copy %s not written", key, exc_info=True)
            with contextlib.suppress(redis.RedisError):
                redis_client.sync_client().delete(key)


def prime(payload: Mapping[str, Any], source_id: int) -> None:
    """A reader's copy of what it just read from the database: written only where no newer
    revision is stored. Best effort, like every read-side write."""
    try:
        _store(payload, source_id)
    except redis.RedisError:
        logger.warning("gate copy not primed", exc_info=True)
