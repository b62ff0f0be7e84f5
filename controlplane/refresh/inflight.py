"""The refresh page's "requests in flight" table: per worker, what its pause did to the requests
it was serving (drained, aborted, kept), read from the journal as the backend reported it.

A view only: `dynamo.inflight` interprets the journaled pause and update replies, nothing is
stored twice.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import TextField
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast

from controlplane.dynamo.inflight import READS, InFlight, account
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


#: The body fields an outcome depends on (`dynamo.inflight.READS`), each read as its value's
#: JSON text (`(body -> key)::text`: SQL NULL when the body lacks the key or is not an object,
#: `null` for a JSON null), so the database sends a few short strings per call instead of
#: every body of the fleet and Python decodes those alone. Rebuilt as `{key: value}`, the
#: bodies give `account` the answer the whole bodies would: it reads nothing else.
_COLUMNS = {"request": "request_body", "response": "response_body"}
_FIELDS = {f"_{side}_{key}": (_COLUMNS[side], key) for side, key in READS}


def _bodies(values: tuple[str | None, ...]) -> tuple[dict[str, object], dict[str, object]]:
    bodies: dict[str, dict[str, object]] = {"request": {}, "response": {}}
    for (side, key), text in zip(READS, values, strict=True):
        if text is not None:
            bodies[side][key] = json.loads(text)
    return bodies["request"], bodies["response"]


def _field_texts(request: object, response: object) -> tuple[str | None, ...]:
    """`(body -> key)::text` computed here: each field's JSON text, None when the body lacks
    the key or is not an object."""
    bodies = {"request": request, "response": response}
    return tuple(
        json.dumps(body[key]) if isinstance(body := bodies[side], dict) and key in body else None
        for side, key in READS
    )


def in_flight_table(refresh: PolicyRefresh) -> InFlightTable:
    """Every worker's outcome (the totals), the first `ROW_LIMIT` by namespace and key as rows.
    One statement; the bodies' few fields that decide an outcome, not the bodies."""
    entries = JournalEntry.objects.filter(
        refresh=refresh,
        ok=True,
        operation__in=("pause", "update_from_disk"),
        planned_worker__isnull=False,
    ).order_by("id")
    head = (
        "planned_worker_id",
        "planned_worker__key",
        "planned_worker__namespace",
        "planned_worker__family",
        "operation",
    )
    rows: Iterable[tuple[Any, ...]]
    if connection.vendor == "postgresql":
        rows = entries.annotate(
            **{
                name: Cast(KeyTransform(key, column), TextField())
                for name, (column, key) in _FIELDS.items()
            }
        ).values_list(*head, *_FIELDS)
    else:
        # SQLite (the embedded demo) casts a JSON string to its bare text, not its JSON
        # text: the bodies come whole and the same fields are taken from them here.
        rows = (
            (*row[:5], *_field_texts(row[5], row[6]))
            for row in entries.values_list(*head, "request_body", "response_body")
        )
    by_worker: dict[int, tuple[str, str, str, list[tuple[str, tuple[str | None, ...]]]]] = {}
    for pk, key, namespace, family, operation, *fields in rows:
        slot = by_worker.setdefault(pk, (key, namespace, family, []))
        slot[3].append((operation, tuple(fields)))
    # A fleet's workers reply alike: `account` is pure, so it runs once per distinct history
    # (family, and each call's operation and fields), not once per worker.
    outcomes: dict[tuple[str, tuple], InFlight | None] = {}
    found: list[tuple[str, str, str, InFlight]] = []
    for key, namespace, family, calls in by_worker.values():
        history = (family, tuple(calls))
        if history not in outcomes:
            outcomes[history] = account(family, [(op, *_bodies(values)) for op, values in calls])
        result = outcomes[history]
        if result is not None:
            found.append((namespace, key, family, result))
    found.sort(key=lambda r: (r[0], r[1]))
    totals = Counter(r[3].outcome for r in found)
    return InFlightTable(
        [
            InFlightRow(key, namespace, family, result)
            for namespace, key, family, result in found[:ROW_LIMIT]
        ],
        dict(sorted(totals.items())),
        max(0, len(found) - ROW_LIMIT),
    )
