"""A running drill holds its namespaces for its whole length, between its two legs too.

Each leg is an ordinary refresh that takes the scope (`ScopeLock`) only while it runs, so
between the forward leg's end and the back leg's start nothing else would stop a refresh from
taking the scope, and the back leg would then be refused. The hold is derived from the
running `DrillRun` row (its source, namespaces and two leg refreshes), never kept as a copy:
`start_policy_refresh` asks `holding_drill` and refuses any refresh but the drill's own legs.

`serialize_scope` makes the two checks exclusive: a refresh start (which inserts its scope
locks, then asks for a drill) and a drill start (which asks for scope locks, then inserts the
drill) of one source run one after the other, so each sees what the other committed.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from controlplane.refresh.models import DrillOutcome, DrillRun

#: First key of the advisory lock a source's refresh and drill starts share (an arbitrary
#: constant, so the lock cannot collide with another use of two-key advisory locks).
_LOCK_SPACE = 0x0D12


def serialize_scope(source_id: int) -> None:
    """Wait for any other refresh or drill start of this source to commit (transaction-scoped;
    taken at the scope-lock level of `lockorder`)."""
    if connection.vendor != "postgresql":
        return  # SQLite serialises every writer already
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_SPACE, int(source_id)])


def holding_drill(
    source_id: int, namespaces: Iterable[str], *, refresh_id: int | None = None
) -> DrillRun | None:
    """The running drill of the source that holds any of `namespaces`, unless `refresh_id`
    is one of its own legs (the forward or back refresh it recorded before starting it)."""
    wanted = set(namespaces)
    for drill in DrillRun.objects.filter(source_id=source_id, outcome=DrillOutcome.RUNNING):
        legs = {drill.forward_refresh_id, drill.back_refresh_id} - {None}
        if refresh_id is not None and refresh_id in legs:
            continue
        if wanted & set(drill.namespaces or []):
            return drill
    return None


def held_by_drill_message(drill: DrillRun, namespaces: Iterable[str]) -> str:
    held = sorted(set(namespaces) & set(drill.namespaces or []))
    return (
        f"rollback drill #{drill.pk} ({drill.phase}) holds {', '.join(held)} until both its "
        "legs have run; start this refresh when the drill has ended"
    )
