"""`controlplane.bulk`: rows written by COPY (PostgreSQL) or executemany (elsewhere) read back
exactly as the ORM would have written them, in the caller's transaction, as one statement."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from controlplane.bulk import JsonText, insert_values
from controlplane.fleet.models import Source, Worker, WorkerEvent

pytestmark = pytest.mark.django_db

FIELDS = ("source", "worker", "run", "occurred_at", "kind", "details")


@pytest.fixture
def worker():
    source = Source.objects.create(
        name="bulk", listener_url="http://127.0.0.1:1", allowed_networks=["127.0.0.0/8"]
    )
    now = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    return Worker.objects.create(
        source=source,
        namespace="rl-a",
        component="backend",
        endpoint="rl",
        instance_id="18446744073709551615",
        first_seen_at=now,
        last_seen_at=now,
    )


def test_rows_read_back_as_written_json_values_text_and_times(worker):
    at = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    shared = {"routes": ["pause_generation"], "text": 'quote " backslash \\ tab \t é ✓'}
    rows = [
        (worker.source_id, worker.pk, None, at, "joined", shared),
        (worker.source_id, worker.pk, None, at, "joined", shared),  # the same object again
        (worker.source_id, worker.pk, None, at, "changed", {"n": [1, 2.5, None, True]}),
        (worker.source_id, worker.pk, None, at, "left", JsonText('{"already":"serialised"}')),
        (worker.source_id, worker.pk, None, at, "left", "a bare string"),
        (worker.source_id, worker.pk, None, at, "left", {"nul-free": "\\N is not null"}),
    ]
    insert_values(WorkerEvent, FIELDS, rows)
    stored = list(WorkerEvent.objects.order_by("pk").values_list("occurred_at", "kind", "details"))
    assert stored == [
        (at, "joined", shared),
        (at, "joined", shared),
        (at, "changed", {"n": [1, 2.5, None, True]}),
        (at, "left", {"already": "serialised"}),
        (at, "left", "a bare string"),
        (at, "left", {"nul-free": "\\N is not null"}),
    ]


def test_a_bulk_insert_is_one_statement_whatever_the_row_count(worker):
    at = datetime.now(UTC)
    rows = [(worker.source_id, worker.pk, None, at, "joined", {"i": i}) for i in range(1200)]
    with CaptureQueriesContext(connection) as queries:
        insert_values(WorkerEvent, FIELDS, rows, batch=500)
    inserts = [q["sql"] for q in queries.captured_queries if "workerevent" in q["sql"]]
    if connection.vendor == "postgresql":
        assert len(inserts) == 1 and inserts[0].startswith("COPY")
    else:
        assert len(inserts) == 3  # executemany per batch of 500
    assert WorkerEvent.objects.count() == 1200


def test_nothing_to_insert_sends_nothing(worker):
    with CaptureQueriesContext(connection) as queries:
        insert_values(WorkerEvent, FIELDS, [])
    assert queries.captured_queries == []


def test_rows_roll_back_with_the_callers_transaction(worker):
    at = datetime.now(UTC)
    with pytest.raises(RuntimeError), transaction.atomic():
        insert_values(WorkerEvent, FIELDS, [(worker.source_id, worker.pk, None, at, "left", {})])
        raise RuntimeError("the fence failed")
    assert not WorkerEvent.objects.exists()


def test_a_row_of_the_wrong_width_is_refused(worker):
    with pytest.raises(ValueError, match="2 values for 6 columns"):
        insert_values(WorkerEvent, FIELDS, [(1, 2)])
    assert not WorkerEvent.objects.exists()


def test_plain_values_and_their_look_alikes_read_back_as_the_orm_stores_them(worker):
    """Plain values skip Django's per-value preparation; anything else (an enum member, a
    time in another zone) still takes it, and both read back as the ORM would store them."""
    from datetime import timedelta, timezone

    from controlplane.fleet.models import WorkerEventKind

    plus_two = datetime(2026, 5, 6, 9, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    rows = [
        (worker.source_id, worker.pk, None, datetime(2026, 5, 6, 7, 8, 9, i, tzinfo=UTC), "x", {})
        for i in range(3)
    ] + [(worker.source_id, worker.pk, None, plus_two, WorkerEventKind.JOINED, {})]
    insert_values(WorkerEvent, FIELDS, rows)
    stored = list(WorkerEvent.objects.order_by("pk").values_list("occurred_at", "kind"))
    assert stored == [(row[3], str(row[4])) for row in rows]
    assert stored[-1] == (datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC), "joined")
    assert type(stored[-1][1]) is str


def test_instances_go_in_as_bulk_create_would_store_them(worker):
    """`insert_objects` writes every column an unsaved instance holds, its defaults
    included, in one statement, and the rows read back as `bulk_create` would have stored
    them."""
    from controlplane.bulk import insert_objects

    at = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)

    def events(kind: str) -> list[WorkerEvent]:
        return [
            WorkerEvent(source=worker.source, worker=worker, occurred_at=at, kind=kind),
            WorkerEvent(
                source=worker.source, worker=worker, occurred_at=at, kind=kind, details={"n": 1}
            ),
        ]

    with CaptureQueriesContext(connection) as queries:
        insert_objects(WorkerEvent, events("joined"))
    assert len(queries.captured_queries) == 1
    WorkerEvent.objects.bulk_create(events("left"))
    columns = ("source_id", "worker_id", "run_id", "occurred_at", "details")
    ours = list(WorkerEvent.objects.filter(kind="joined").order_by("pk").values_list(*columns))
    django = list(WorkerEvent.objects.filter(kind="left").order_by("pk").values_list(*columns))
    assert ours == django and len(ours) == 2
