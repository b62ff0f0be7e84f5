"""The refresh page's in-flight table reads only the body fields an outcome depends on: it must
answer what `dynamo.inflight.account` answers from the whole journaled bodies, for every shape
a backend may reply with (types that only look alike, keys missing or null, bodies that are
not objects, a retried pause)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from controlplane.dynamo.inflight import account
from controlplane.fleet.models import Source
from controlplane.refresh import inflight
from controlplane.refresh.inflight import in_flight_table
from controlplane.refresh.models import JournalEntry, PlannedWorker
from tests.fixtures.scale import make_refresh

pytestmark = pytest.mark.django_db

BIG = {"status": "ok", "log": "x" * 5000, "detail": {"nested": list(range(50))}}

#: Per worker: its family and its ok calls, oldest first: (operation, request, response).
CASES: list[tuple[str, list[tuple[str, object, object]]]] = [
    ("vllm", [("pause", None, {**BIG, "mode": "wait"})]),
    ("vllm", [("pause", {"mode": "wait"}, {"status": "ok"})]),  # the reply does not say
    ("vllm", [("pause", None, {"mode": ["wait"]})]),
    ("vllm", [("pause", None, {"mode": "abort"}), ("pause", None, {"mode": "keep"})]),
    ("vllm", [("pause", None, ["mode", "wait"])]),  # not an object
    ("vllm-sidecar", [("pause", {"mode": "keep"}, {"status": "paused"})]),
    ("vllm-sidecar", [("pause", {"mode": "keep"}, {"status": "ok"})]),
    ("sglang", [("pause", {}, {"status": "ok"})]),  # no mode: SGLang's abort
    ("sglang", [("pause", {"mode": None}, {"status": "ok"})]),  # null is not missing
    ("sglang", [("pause", "abort", {"status": "ok"})]),  # a string body
    (
        "sglang",
        [
            ("pause", {"mode": "retract"}, {}),
            ("update_from_disk", {"abort_all_requests": True}, {"num_paused_requests": 3}),
        ],
    ),
    (
        "sglang",
        [
            ("pause", {"mode": "retract"}, {}),
            ("update_from_disk", {"abort_all_requests": "true"}, {"num_paused_requests": 2}),
        ],
    ),
    (
        "sglang",
        [
            ("pause", {"mode": "in_place"}, {}),
            ("update_from_disk", {"abort_all_requests": False}, {"num_paused_requests": 3.0}),
        ],
    ),
    (
        "sglang",
        [
            ("pause", {"mode": "in_place"}, {}),
            ("update_from_disk", {}, {"num_paused_requests": True}),
        ],
    ),
    ("sglang", [("update_from_disk", {"abort_all_requests": False}, {"num_paused_requests": 0})]),
    ("sglang", [("pause", {"mode": "retract"}, {"message": 'say "kept"\\n'})]),
]


@pytest.fixture
def refresh():
    source = Source.objects.create(
        name="inflight", listener_url="http://127.0.0.1:9/", allowed_networks=["10.0.0.0/8"]
    )
    refresh = make_refresh(source, len(CASES))
    JournalEntry.objects.filter(refresh=refresh).delete()
    workers = list(PlannedWorker.objects.filter(refresh=refresh).order_by("id"))
    for worker, (family, calls) in zip(workers, CASES, strict=True):
        worker.family = family
        worker.save(update_fields=["family"])
        template = {
            "refresh": refresh,
            "planned_worker": worker,
            "method": "POST",
            "url": f"{worker.system_url}/engine",
            "http_status": 200,
            "ok": True,
            "lease_token": 1,
            "duration_ms": 1.0,
            "started_at": refresh.started_at,
            "finished_at": refresh.started_at,
        }
        for operation, request, response in calls:
            JournalEntry.objects.create(
                **template,
                step="update" if operation == "update_from_disk" else "pause",
                operation=operation,
                request_body=request,
                response_body=response,
            )
    return refresh


def test_the_table_answers_what_the_whole_bodies_answer(refresh, monkeypatch):
    workers = PlannedWorker.objects.filter(refresh=refresh).order_by("namespace", "key")
    by_id = {
        w.pk: (family, calls)
        for w, (family, calls) in zip(
            PlannedWorker.objects.filter(refresh=refresh).order_by("id"), CASES, strict=True
        )
    }
    expected = []
    for worker in workers:
        family, calls = by_id[worker.pk]
        result = account(family, calls)
        if result is not None:
            expected.append((worker.key, family, result))
    # The cases reach every outcome and both sides of every type check.
    assert {r.outcome for _, _, r in expected} == {"drained", "aborted", "kept"}
    assert len(expected) < len(CASES)

    table = in_flight_table(refresh)
    assert [(r.key, r.family, r.accounting) for r in table.rows] == expected
    assert table.totals == dict(sorted(Counter(r.outcome for _, _, r in expected).items()))
    assert table.more == 0

    # The rows shown are the first by namespace and key; the totals still count every worker.
    monkeypatch.setattr(inflight, "ROW_LIMIT", 3)
    table = in_flight_table(refresh)
    assert [(r.key, r.family, r.accounting) for r in table.rows] == expected[:3]
    assert sum(table.totals.values()) == len(expected) and table.more == len(expected) - 3


def test_without_postgresql_the_fields_are_taken_from_the_whole_bodies(refresh, monkeypatch):
    """SQLite (the embedded demo) casts a JSON string to its bare text: there the table reads
    the bodies whole and takes the same fields itself, with the same answer."""
    on_postgresql = in_flight_table(refresh)
    monkeypatch.setattr(inflight, "connection", SimpleNamespace(vendor="sqlite"))
    assert in_flight_table(refresh) == on_postgresql
