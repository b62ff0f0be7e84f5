"""The refresh page's "requests in flight" table: per worker, what its pause did to the requests
it was serving (drained, aborted, kept), read from the journal as the backend reported it.

A view only: `dynamo.inflight` interprets the journaled pause and update replies, nothing is
stored twice.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from controlplane.dynamo.inflight import InFlight, account
from controlplane.refresh.models import JournalEntry, PolicyRefresh

#: Rows shown on the page; the counts cover every worker.
ROW_LIMIT = 100


@dataclass(frozen=True)
class InFlightRow:
    key: str
    namespace: str
    family: str
    accounting: InFlight


@dataclass(frozen=True)
class InFlightTable:
    rows: list[InFlightRow]
    totals: dict[str, int]
    #: Workers with an outcome beyond the rows shown.
    more: int


def in_flight_table(refresh: PolicyRefresh) -> InFlightTable:
    entries = (
        JournalEntry.objects.filter(
            refresh=refresh,
            ok=True,
            operation__in=("pause", "update_from_disk"),
            planned_worker__isnull=False,
        )
        .order_by("id")
        .values_list(
            "planned_worker_id",
            "planned_worker__key",
            "planned_worker__namespace",
            "planned_worker__family",
            "operation",
            "request_body",
            "response_body",
        )
    )
    by_worker: dict[int, tuple[str, str, str, list[tuple[str, object, object]]]] = {}
    for pk, key, namespace, family, operation, request, response in entries:
        slot = by_worker.setdefault(pk, (key, namespace, family, []))
        slot[3].append((operation, request, response))
    rows: list[InFlightRow] = []
    for key, namespace, family, calls in by_worker.values():
        result = account(family, calls)
        if result is not None:
            rows.append(InFlightRow(key, namespace, family, result))
    rows.sort(key=lambda r: (r.namespace, r.key))
    totals = Counter(r.accounting.outcome for r in rows)
    return InFlightTable(
        rows[:ROW_LIMIT], dict(sorted(totals.items())), max(0, len(rows) - ROW_LIMIT)
    )
