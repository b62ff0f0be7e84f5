"""The History page's chain status: verified up to which row and when, or broken at which row.

Incremental, never a full walk per page view. The newest row known good (its sequence, hash,
where keyed rows began, and when it was verified) is kept in the cache. Each read:

1. re-reads the known-good row's hash (the first row of the same query): a rewrite of that
   row, or a table truncated below it, shows at once;
2. verifies only the rows after it with `chain.verify_chain(after=...)` (links, HMACs, the
   unkeyed-after-keyed rule), at most `VERIFY_BATCH` per read, so a long backlog (a first
   read on a big table, a cleared cache) is spread over a few reads and the page says how far
   it got;
3. once it reaches the chain head, checks the head agrees with the table's end (rows deleted
   at the end).

The mark is kept per database (several may share one Redis) and remembers row #1's hash: a
different row #1 is another chain (a database recreated under the same name, or one rewritten
from its start) and is verified afresh from row #1 — keeping the row where keyed rows began, so
a rewrite without the key still fails there.

What it cannot see is a row *before* the mark rewritten after it was verified (other than the
mark itself), nor a log deleted whole (it reads as empty): a full walk finds that —
`manage.py audit verify` and the checkpoint task with its signed checkpoints outside the
database. The page says "incrementally" for that reason.
A break is kept until the chain verifies again from the last good mark (it does not, unless
someone restores the rows), and never advances the mark.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from django.core.cache import cache
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from controlplane.audit.anchors import AnchorSet, verification_rows
from controlplane.audit.chain import GENESIS_HASH, verify_chain
from controlplane.audit.models import AuditChainHead, AuditEvent

CACHE_KEY = "audit:chain-status:v2"
#: Rows verified per read at most: one read of this many rows takes tens of milliseconds.
VERIFY_BATCH = 5000

State = Literal["empty", "verified", "partial", "broken"]


@dataclass(frozen=True)
class ChainStatus:
    """What the History page says about the chain."""

    state: State
    #: The newest row verified good, and when that was last confirmed.
    verified_to: int
    verified_at: dt.datetime | None
    #: The chain head's row when this read ran.
    head: int
    broken_at: int | None = None
    problem: str = ""

    @property
    def unchecked(self) -> int:
        return max(self.head - self.verified_to, 0)


def _cache_key() -> str:
    """One mark per database: several databases may share one Redis (a demo and a shell,
    test runs), and a mark from another chain would read as a rewrite of this one."""
    db = connection.settings_dict
    return f"{CACHE_KEY}:{db.get('HOST') or ''}:{db.get('PORT') or ''}:{db['NAME']}"


def _mark() -> dict:
    saved = cache.get(_cache_key())
    if isinstance(saved, dict) and isinstance(saved.get("sequence"), int):
        return saved
    return _fresh(keyed_from=None)


def _fresh(keyed_from: int | None) -> dict:
    return {
        "sequence": 0,
        "hash": GENESIS_HASH,
        "origin": "",
        "keyed_from": keyed_from,
        "verified_at": None,
    }


def _broken(mark: dict, head: int, sequence: int, problem: str) -> ChainStatus:
    return ChainStatus(
        "broken",
        mark["sequence"],
        _when(mark),
        head,
        broken_at=sequence,
        problem=problem,
    )


def _when(mark: dict) -> dt.datetime | None:
    stamp = mark.get("verified_at")
    return dt.datetime.fromisoformat(stamp) if isinstance(stamp, str) else None


def _noting_origin(rows: Iterator, seen: list[str]) -> Iterator:
    """The rows, unchanged, noting row #1's hash on the way (a walk from the start has it)."""
    for row in rows:
        if row.sequence == 1 and not seen:
            seen.append(row.entry_hash)
        yield row


def chain_status(batch: int = VERIFY_BATCH) -> ChainStatus:
    """Verify the rows since the last known-good one (at most `batch`) and say where it
    stands. Advances the cached mark only over rows that verified."""
    mark = _mark()
    head_row = AuditChainHead.objects.first()
    head = head_row.last_sequence if head_row is not None else 0
    upto = min(head, mark["sequence"] + batch)
    # One query: row #1 (which chain this is), the known-good row, then the rows after it.
    rows = verification_rows(
        AuditEvent.objects.filter(
            Q(sequence=1) | Q(sequence__gte=mark["sequence"], sequence__lte=upto)
        )
    )
    if mark["sequence"]:
        origin = next(rows, None)
        if origin is None or origin.sequence != 1 or origin.entry_hash != mark.get("origin", ""):
            # Another chain: the database was recreated, or rewritten from its first row.
            # Start over from row #1: a rewrite without the key fails there, and keyed rows
            # stay required from where they began. (A log deleted whole reads as empty here;
            # the signed checkpoints outside the database reveal that.)
            cache.set(_cache_key(), _fresh(mark.get("keyed_from")), timeout=None)
            return chain_status(batch)
        pinned = origin if mark["sequence"] == 1 else next(rows, None)
        if pinned is None or (pinned.sequence, pinned.entry_hash) != (
            mark["sequence"],
            mark["hash"],
        ):
            return _broken(
                mark,
                head,
                mark["sequence"],
                f"row #{mark['sequence']} no longer has the hash it had when verified "
                "(rewritten, or rows at the end were deleted)",
            )
    if head < mark["sequence"]:
        return _broken(
            mark,
            head,
            head + 1,
            f"the chain head records #{head} but row #{mark['sequence']} was verified "
            "(rows at the end were deleted)",
        )
    origin_hash: list[str] = [mark.get("origin", "")] if mark.get("origin", "") else []
    pins = AnchorSet(keyed_from=mark.get("keyed_from"))
    report = verify_chain(
        _noting_origin(rows, origin_hash),
        # The head is compared only when this read reaches it: a capped batch ends before it.
        head=head_row if upto == head else None,
        anchors=pins,
        after=(mark["sequence"], mark["hash"]),
    )
    if not report.ok:
        return _broken(mark, head, report.first_bad_sequence or 0, report.problem or "")
    if report.last_sequence < upto:  # the table ends before the head (a capped batch)
        return _broken(
            mark,
            head,
            report.last_sequence + 1,
            f"row #{report.last_sequence + 1} is missing (the chain head is at #{head})",
        )
    now = timezone.now()
    mark = {
        "sequence": report.last_sequence,
        "hash": report.last_hash,
        "origin": origin_hash[0] if origin_hash else "",
        "keyed_from": mark.get("keyed_from") or report.keyed_from,
        "verified_at": now.isoformat(),
    }
    cache.set(_cache_key(), mark, timeout=None)
    if head == 0:
        return ChainStatus("empty", 0, None, 0)
    state: State = "verified" if report.last_sequence == head else "partial"
    return ChainStatus(state, report.last_sequence, now, head)
