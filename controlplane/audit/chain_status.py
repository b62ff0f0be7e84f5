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

What it cannot see is a row *before* the mark rewritten after it was verified (other than the
mark itself): a full walk finds that — `manage.py audit verify` and the checkpoint task with its
signed checkpoints outside the database. The page says "incrementally" for that reason.
A break is kept until the chain verifies again from the last good mark (it does not, unless
someone restores the rows), and never advances the mark.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from django.core.cache import cache
from django.utils import timezone

from controlplane.audit.anchors import AnchorSet, verification_rows
from controlplane.audit.chain import GENESIS_HASH, verify_chain
from controlplane.audit.models import AuditChainHead, AuditEvent

CACHE_KEY = "audit:chain-status:v1"
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


def _mark() -> dict:
    saved = cache.get(CACHE_KEY)
    if isinstance(saved, dict) and isinstance(saved.get("sequence"), int):
        return saved
    return {"sequence": 0, "hash": GENESIS_HASH, "keyed_from": None, "verified_at": None}


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


def chain_status(batch: int = VERIFY_BATCH) -> ChainStatus:
    """Verify the rows since the last known-good one (at most `batch`) and say where it
    stands. Advances the cached mark only over rows that verified."""
    mark = _mark()
    head_row = AuditChainHead.objects.first()
    head = head_row.last_sequence if head_row is not None else 0
    if head < mark["sequence"]:
        return _broken(
            mark,
            head,
            head + 1,
            f"the chain head records #{head} but row #{mark['sequence']} was verified "
            "(rows at the end were deleted)",
        )
    upto = min(head, mark["sequence"] + batch)
    # The known-good row comes first in the same query: its hash must not have changed.
    rows = verification_rows(
        AuditEvent.objects.filter(sequence__gte=mark["sequence"], sequence__lte=upto)
    )
    if mark["sequence"]:
        pinned = next(rows, None)
        if pinned is None or (pinned.sequence, pinned.entry_hash) != (
            mark["sequence"],
            mark["hash"],
        ):
            return _broken(
                mark,
                head,
                mark["sequence"],
                f"row #{mark['sequence']} no longer has the hash it had when verified "
                "(rewritten, or the chain was truncated)",
            )
    pins = AnchorSet(keyed_from=mark.get("keyed_from"))
    report = verify_chain(
        rows,
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
        "keyed_from": mark.get("keyed_from") or report.keyed_from,
        "verified_at": now.isoformat(),
    }
    cache.set(CACHE_KEY, mark, timeout=None)
    if head == 0:
        return ChainStatus("empty", 0, None, 0)
    state: State = "verified" if report.last_sequence == head else "partial"
    return ChainStatus(state, report.last_sequence, now, head)
