"""A policy refresh's SQL statements do not grow with the fleet.

The journal is written in a fixed number of flushes per step (each one COPY on PostgreSQL),
and every other read or write of a refresh is per step or per refresh, never per worker. So a
refresh of 2,000 workers issues exactly the statements of one of 100. Only time adds any: a
heartbeat that finds rows waiting writes them, and a slow step renews its lease (switched off
here: they depend on the machine's speed, not on the fleet; `test_heartbeat.py` counts them).
"""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh, journal
from controlplane.refresh.models import (
    JournalEntry,
    PolicyRefresh,
    RefreshState,
    WorkerStepResult,
)
from controlplane.simfleet import Fault, FleetConfig
from tests.integration.refresh.helpers import (
    NAMESPACES,
    actor_for,
    fleet_config,
    make_source,
    plan,
    wait_for,
)
from tests.postgres import postgres_only

pytestmark = pytest.mark.django_db(transaction=True)


def refresh_queries(simfleet_factory, operator, workers: int) -> tuple[int, int]:
    fleet = simfleet_factory(
        FleetConfig.generate(
            workers=workers,
            namespaces=NAMESPACES,
            prefix="rl",
            seed=7,
            listener_env={"DYN_RL_MAX_CONCURRENT_PROBES": "4096"},
        )
    )
    source = make_source(fleet, name=f"sim-{workers}")
    refresh = plan(source, operator, "v2")
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    with CaptureQueriesContext(connection) as queries:
        state = execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert state == RefreshState.SUCCEEDED, refresh.held_reason
    # Every call is journaled: pause, update, resume, version, liveness, generation.
    assert JournalEntry.objects.filter(refresh=refresh).count() >= 6 * workers
    return len(queries.captured_queries), workers


@postgres_only
def test_refresh_queries_do_not_grow_with_the_fleet(simfleet_factory, operator, monkeypatch):
    monkeypatch.setattr(journal, "HEARTBEAT_SECONDS", 3600.0)
    small, _ = refresh_queries(simfleet_factory, operator, 100)
    large, _ = refresh_queries(simfleet_factory, operator, 2000)
    assert large == small, (small, large)


def test_a_slow_worker_does_not_hold_back_the_journal_of_the_others(
    simfleet_factory, operator, monkeypatch
):
    """Count-based flushes wait for a share of the step's workers; the heartbeat writes what
    has finished, and renews the lease when due, while one slow call is still in flight."""
    monkeypatch.setattr(journal, "HEARTBEAT_SECONDS", 0.2)
    # A renewal due every 0.5 s rather than every third of the lease.
    monkeypatch.setattr(journal, "LEASE_RENEWAL_FRACTION", 0.5 / settings.REFRESH_LEASE_SECONDS)
    fleet = simfleet_factory(fleet_config(12))
    source = make_source(fleet)
    slow = fleet.workers()[0]["key"]
    fleet.inject(slow, "pause_generation", Fault.latency(10.0, once=True))
    refresh = plan(source, operator, "v2")
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    lease_before = []

    def run() -> None:
        try:
            execute_refresh(refresh.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        # Eleven workers paused quickly; the twelfth is still in its call.
        wait_for(
            lambda: WorkerStepResult.objects.filter(refresh=refresh, step="pause").count() == 11,
            timeout=6.0,
        )
        lease_before.append(PolicyRefresh.objects.get(pk=refresh.pk).lease_expires_at)
        assert not WorkerStepResult.objects.filter(
            refresh=refresh, step="pause", planned_worker__key=slow
        ).exists()
        # Heartbeats go on renewing the lease while the slow call runs.
        wait_for(
            lambda: PolicyRefresh.objects.get(pk=refresh.pk).lease_expires_at > lease_before[0],
            timeout=3.0,
        )
    finally:
        thread.join(60)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
