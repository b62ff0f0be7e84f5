"""Discovery storing rows that changed: alike (a policy refresh moved every worker to one
version) in a few plain UPDATEs, the rest row by row, every row ending as observed."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.fleet.discovery import run_discovery, store
from controlplane.fleet.models import DiscoveryTrigger, Worker, WorkerState
from controlplane.simfleet import Fault

MANUAL = DiscoveryTrigger.MANUAL


def _versions(source) -> dict[str, str]:
    return dict(Worker.objects.filter(source=source).values_list("instance_id", "weight_version"))


def _worker_updates(queries) -> list[str]:
    table = Worker._meta.db_table
    return [q["sql"] for q in queries if q["sql"].startswith(f'UPDATE "{table}"')]


def test_a_fleet_moved_to_one_version_is_stored_without_a_per_row_case(
    simfleet_factory, make_source
):
    fleet = simfleet_factory(workers=12, namespaces=["rl-a", "rl-b"], prefix="rl", seed=5)
    source = make_source(fleet)
    run_discovery(source.pk, trigger=MANUAL)
    ids = [w["instance_id"] for w in fleet.workers()]
    for instance_id in ids:
        fleet.set_version(instance_id, "step-9")

    with CaptureQueriesContext(connection) as queries:
        run = run_discovery(source.pk, trigger=MANUAL)

    assert run.ok
    assert set(_versions(source).values()) == {"step-9"}
    updates = _worker_updates(queries.captured_queries)
    # The version is written once for all of them; bulk_update would send a CASE per row.
    assert not [sql for sql in updates if "CASE" in sql], updates


def test_rows_changed_in_many_ways_all_end_as_observed(simfleet_factory, make_source):
    fleet = simfleet_factory(workers=16, namespaces=["rl-a"], prefix="rl", seed=6)
    source = make_source(fleet)
    run_discovery(source.pk, trigger=MANUAL)
    ids = [w["instance_id"] for w in fleet.workers()]
    # More groups of alike rows than get plain UPDATEs, single odd ones, and one worker whose
    # probe fails (state and error change with the version kept).
    groups = store.SHARED_CHANGES + 2
    expected = {}
    for n, instance_id in enumerate(ids[:-1]):
        version = f"step-{n % groups}" if n < 2 * groups else f"odd-{n}"
        fleet.set_version(instance_id, version)
        expected[str(instance_id)] = version
    erroring = ids[-1]
    kept = _versions(source)[str(erroring)]
    fleet.inject(erroring, "probe", Fault(kind="probe_error", message="engine is dead"))

    run = run_discovery(source.pk, trigger=MANUAL)

    assert run.ok
    assert {k: v for k, v in _versions(source).items() if k != str(erroring)} == expected
    worker = Worker.objects.get(source=source, instance_id=str(erroring))
    assert worker.state == WorkerState.ERRORING and worker.error == "engine is dead"
    assert worker.weight_version == kept
    others = Worker.objects.filter(source=source).exclude(pk=worker.pk)
    assert {w.state for w in others} == {WorkerState.LIVE}
