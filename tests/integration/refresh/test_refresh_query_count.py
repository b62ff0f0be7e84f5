"""A policy refresh's SQL statements do not grow with the fleet.

The journal is written in a bounded number of flushes per step (each one COPY on PostgreSQL),
and every other read or write of a refresh is per step or per refresh, never per worker. So a
refresh of 2,000 workers issues the same statements as one of 100, give or take the few
time-based heartbeats a longer step needs (switched off here: they depend on the machine's
speed, not on the fleet, and have a test of their own).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.refresh import actions
from controlplane.refresh.executor import execute_refresh, journal
from controlplane.refresh.models import JournalEntry, RefreshState
from controlplane.simfleet import FleetConfig
from tests.integration.refresh.helpers import NAMESPACES, actor_for, make_source, plan

pytestmark = pytest.mark.django_db(transaction=True)

#: Statements a larger fleet may add: none expected; a little slack for a step whose workers
#: happen to finish across one more count-based flush boundary.
SLACK = 4


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
    actions.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    with CaptureQueriesContext(connection) as queries:
        state = execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert state == RefreshState.SUCCEEDED, refresh.held_reason
    # Every call is journaled: pause, update, resume, version, liveness, generation.
    assert JournalEntry.objects.filter(refresh=refresh).count() >= 6 * workers
    return len(queries.captured_queries), workers


def test_refresh_queries_do_not_grow_with_the_fleet(simfleet_factory, operator, monkeypatch):
    monkeypatch.setattr(journal, "HEARTBEAT_SECONDS", 3600.0)
    small, _ = refresh_queries(simfleet_factory, operator, 100)
    large, _ = refresh_queries(simfleet_factory, operator, 2000)
    assert large <= small + SLACK, (small, large)
