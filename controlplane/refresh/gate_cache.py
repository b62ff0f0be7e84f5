"""The gates' public state, copied to Redis so the gate API answers without the database.

`refresh.gates` (the only writer of gate rows) stores a gate's serialisation here, read from
the committed row, when the transaction that bumped its revision (or moved `confirmed_at`)
commits, before the live push: readers never see a state that was rolled back. The gate API
reads the copy; on a miss it serialises the row from the database and primes the copy
(`prime`).

One value per gate, `"<revision> <source id> <serialize_gate JSON>"`: the revision and source
id come first so an `If-None-Match` poll is answered (and a source-limited token refused)
without parsing the JSON. Writes are compare-and-set on the revision, in one Lua script: a
reader that loaded revision 7 from the database and primes after the writer stored revision 8
changes nothing, whatever the order the two reach Redis in.

The copy also expires after `TTL_SECONDS`. The gate's own changes all come through here, but
its answer also shows its source's name and, for an `unknown` gate, the source's staleness,
which change elsewhere; and a write that failed (Redis briefly away at commit) must not leave a
stale gate behind for long. Rebuilding a gate's copy every few seconds costs a few queries,
not a few per poll.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from controlplane import redis_client

logger = logging.getLogger(__name__)

TTL_SECONDS = 10

# KEYS[1] the gate; ARGV: revision, value, "1" when an equal revision may be replaced (a
# writer moving `confirmed_at`), TTL. A reader priming from the database passes "0".
_STORE_IF_NOT_OLDER = """
local current = redis.call('GET', KEYS[1])
if current then
  local stored = tonumber(string.match(current, '^(%d+) '))
  local offered = tonumber(ARGV[1])
  if stored and (stored > offered or (stored == offered and ARGV[3] ~= '1')) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[4]))
return 1
"""


@dataclass(frozen=True)
class CachedGate:
    """One gate's copy: `body` is `serialize_gate`'s JSON, as bytes."""

    revision: int
    source_id: int
    body: bytes

    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


def gate_key(source_name: str, namespace: str) -> str:
    # Source names are slugs (no ":"), so the split between source and namespace is unambiguous.
    return redis_client.key("gate", source_name, namespace)


def encode(payload: Mapping[str, Any], source_id: int) -> bytes:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"{int(payload['revision'])} {int(source_id)} {body}".encode()


def decode(raw: bytes | str | None) -> CachedGate | None:
    """The copy in `raw`, or None for a missing or unreadable value (read as a miss)."""
    if not raw:
        return None
    if isinstance(raw, str):
        raw = raw.encode()
    revision, _, rest = raw.partition(b" ")
    source_id, _, body = rest.partition(b" ")
    if not (revision.isdigit() and source_id.isdigit() and body.startswith(b"{")):
        return None
    return CachedGate(int(revision), int(source_id), body)


def read(source_name: str, namespace: str) -> CachedGate | None:
    try:
        raw = redis_client.sync_client().get(gate_key(source_name, namespace))
    except redis.RedisError:
        logger.warning("gate copy unreadable; answering from the database", exc_info=True)
        return None
    return decode(raw)


def _store(payload: Mapping[str, Any], source_id: int, *, replace_equal: bool) -> bool:
    client = redis_client.sync_client()
    key = gate_key(str(payload["source"]), str(payload["namespace"]))
    revision, value = int(payload["revision"]), encode(payload, source_id)
    flag = "1" if replace_equal else "0"
    return bool(client.eval(_STORE_IF_NOT_OLDER, 1, key, revision, value, flag, TTL_SECONDS))


def store(payloads: Iterable[Mapping[str, Any]]) -> None:
    """Store committed gates (`serialize_gate` payloads; an equal revision is replaced, as
    `confirmed_at` moves without one). Never raises, since it runs after commit: a copy that
    cannot be written is deleted if possible, and expires within `TTL_SECONDS` otherwise."""
    for payload in payloads:
        try:
            _store(payload, int(payload["source_id"]), replace_equal=True)
        except redis.RedisError:
            key = gate_key(str(payload["source"]), str(payload["namespace"]))
            logger.warning("gate copy %s not written", key, exc_info=True)
            with contextlib.suppress(redis.RedisError):
                redis_client.sync_client().delete(key)


def prime(payload: Mapping[str, Any], source_id: int) -> None:
    """A reader's copy of what it just read from the database: written only where no newer
    revision is stored. Best effort, like every read-side write."""
    try:
        _store(payload, source_id, replace_equal=False)
    except redis.RedisError:
        logger.warning("gate copy not primed", exc_info=True)
