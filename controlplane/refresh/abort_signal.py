"""An abort request, signalled through Redis so a running step hears it without a query.

The refresh row (`aborting`, with `abort_requested` set) is the truth; this key is only a hint.
`abort_policy_refresh` sets it once the transaction that moved the refresh to `aborting`
commits (`send_on_commit`), and the running step reads it (`read`) at every heartbeat and, while
calls are in flight, every `journal.ABORT_WATCH_SECONDS`: when the key is there, the step
confirms with the fenced database read it would do anyway (`Lease.guard_reading_abort`) and
cancels its calls in flight (docs/operate/abort.md). So a signal never aborts
anything by itself: one left behind after a retry reset the flag costs one statement, after
which the reader withdraws it (`withdraw`). A reader that cannot reach Redis must not assume
"no abort": `read` raises, and the heartbeat falls back to the database.

Each request stores a value of its own, so withdrawing a stale signal (compare-and-delete)
never removes one sent by a later request. The key expires after `TTL_SECONDS`: an abort is
honoured within a fraction of a second of its request while a step runs, and at the next step
boundary (the runner reads the state) otherwise, so an older key has done its work.
"""

from __future__ import annotations

import logging
import uuid

import redis
from django.db import transaction

from controlplane import redis_client

logger = logging.getLogger(__name__)

TTL_SECONDS = 300

# KEYS[1] the signal; ARGV[1] the value that was found stale.
_DELETE_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def signal_key(refresh_id: int) -> str:
    return redis_client.key("refresh", str(int(refresh_id)), "abort")


def send(refresh_id: int) -> None:
    """Signal an abort that is committed. Never raises (it runs after commit): a signal that
    cannot be written leaves the running step to find the flag at its next lease renewal or
    journal flush, both of which read it."""
    try:
        redis_client.sync_client().set(signal_key(refresh_id), uuid.uuid4().hex, ex=TTL_SECONDS)
    except redis.RedisError:
        logger.warning("policy refresh #%s: abort signal not written", refresh_id, exc_info=True)


def send_on_commit(refresh_id: int) -> None:
    """`send` once the current transaction commits (a rolled-back request signals nothing)."""
    transaction.on_commit(lambda: send(refresh_id))


def read(refresh_id: int) -> bytes | str | None:
    """The signal's value, None when no abort was signalled. Raises `redis.RedisError` when
    Redis cannot be read: the caller must then ask the database."""
    value = redis_client.sync_client().get(signal_key(refresh_id))
    return value if value else None


def withdraw(refresh_id: int, value: bytes | str) -> None:
    """Remove a signal the database refuted, unless another request replaced it since.
    Best effort: a signal left behind costs one more check and lapses with its TTL."""
    try:
        redis_client.sync_client().eval(_DELETE_IF_EQUAL, 1, signal_key(refresh_id), value)
    except redis.RedisError:
        logger.warning("policy refresh #%s: stale abort signal kept", refresh_id, exc_info=True)
