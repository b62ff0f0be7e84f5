"""`world_size` is optional listener metadata recorded with its provenance, never a rank map: the
plan's rank map gives each worker as many ranks as it advertised, and a worker whose
`world_size` changed between the plan and the update is topology drift. The distributed update
holds at its barrier, naming the worker and both values, before any rank joins."""

from __future__ import annotations

import pytest

from controlplane.refresh.models import JournalEntry, RefreshState
from tests.integration.refresh.helpers import execute_in_thread, make_source, paused_workers
from tests.integration.refresh.test_distributed_update import (
    big_fleet,
    distributed,
    plan_and_start,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_world_size_is_recorded_with_its_provenance(simfleet_factory, operator):
    from tests.integration.refresh.helpers import fleet_config

    config = fleet_config(4, seed=5)
    for i, spec in enumerate(config.workers):
        spec.family = "vllm-sidecar" if i % 2 else "vllm"
        spec.world_size = 2 if i % 2 else 1
    config.workers[0].world_size = None  # the listener entry says nothing
    source = make_source(simfleet_factory(config))
    from tests.integration.refresh.helpers import plan

    refresh = plan(source, operator)
    rows = {w.family: w for w in refresh.workers.exclude(world_size=None)}
    assert rows["vllm-sidecar"].world_size == 2
    assert "--vllm-rl-world-size" in rows["vllm-sidecar"].world_size_from
    assert rows["vllm"].world_size_from == "listener metadata: the worker's own rl descriptor"
    unreported = refresh.workers.get(world_size=None)
    assert unreported.world_size_from == ""
    topology = refresh.compat["topology"]
    assert topology["worker_world_size_from"]["unreported"] == 1
    assert sum(topology["worker_world_size_from"].values()) == 4


def test_a_world_size_change_between_plan_and_update_fails_the_update_barrier(
    simfleet_factory, transactional_db, operator
):
    fleet = big_fleet(simfleet_factory, workers=4)
    source = make_source(fleet)
    refresh = plan_and_start(source, operator, distributed("v21"))
    moved = refresh.workers.order_by("key").first()
    planned_size = moved.world_size
    assert planned_size == moved.ranks  # the plan gave it as many ranks as it advertised
    fleet.set_world_size(moved.key, planned_size + 2)

    thread, done = execute_in_thread(refresh)
    thread.join(60)
    refresh.refresh_from_db()
    assert done == [RefreshState.HELD]
    assert refresh.failed_step == "update"
    assert "topology drift at the update barrier" in refresh.held_reason
    assert f"{moved.key} world_size {planned_size} at plan, {planned_size + 2} now" in (
        refresh.held_reason
    )
    # No rank joined a group sized for the old topology; the workers stay paused, owned.
    assert not JournalEntry.objects.filter(refresh=refresh, step="group_init").exists()
    assert fleet.groups() == []
    assert len(paused_workers(fleet)) == 4
    assert refresh.locks.exists()
