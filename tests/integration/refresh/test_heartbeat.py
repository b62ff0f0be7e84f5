"""A step's heartbeat costs no SQL while nothing is due: abort through Redis, lease renewals.

The journal's heartbeat used to be a fenced flush every beat (lease renewal and abort flag read
in one statement). Now a beat with nothing to write reads the Redis abort signal and runs SQL
only for a lease renewal that is due, a signal to confirm, or a Redis it cannot read. These
tests make every step's calls outlast many beats (beats of 20 ms, updates of a second or more)
and pin the renewal interval, so what they count does not depend on the machine's speed.
"""

from __future__ import annotations

import pytest
import redis
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from controlplane import redis_client
from controlplane.refresh import abort_signal, intents
from controlplane.refresh.executor import execute_refresh, journal
from controlplane.refresh.executor.lease import Lease
from controlplane.refresh.models import PolicyRefresh, RefreshState, WorkerStepResult
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    execute_in_thread,
    fleet_config,
    make_source,
    plan,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

UPDATE_ROUTE = "update_weights_from_disk"
BEAT = 0.02
WORKERS = 6


@pytest.fixture
def beats(monkeypatch, settings):
    """Beats every 20 ms; a lease long enough that no renewal falls due unless a test asks."""
    settings.REFRESH_LEASE_SECONDS = 3600.0
    monkeypatch.setattr(journal, "HEARTBEAT_SECONDS", BEAT)
    # One flush per outcome: the flushes with rows are then the same however calls interleave
    # with beats, and whatever a beat costs shows in the count.
    monkeypatch.setattr(journal, "FLUSHES_PER_STEP", 10_000)
    counted = {"beats": 0, "renewals": 0}
    heartbeat, renewal_due = journal.StepJournal.heartbeat, Lease.renewal_due

    def counting_heartbeat(self):
        counted["beats"] += 1
        heartbeat(self)

    def counting_renewal_due(self, fraction):
        due = renewal_due(self, fraction)
        counted["renewals"] += due
        return due

    monkeypatch.setattr(journal.StepJournal, "heartbeat", counting_heartbeat)
    monkeypatch.setattr(Lease, "renewal_due", counting_renewal_due)
    return counted


def renew_every(monkeypatch, seconds: float) -> None:
    monkeypatch.setattr(journal, "LEASE_RENEWAL_FRACTION", seconds / 3600.0)


def slow_updates(fleet, seconds: float) -> None:
    for worker in fleet.workers():
        fleet.inject(worker["key"], UPDATE_ROUTE, Fault.latency(seconds, once=True))


def started(fleet, operator, name: str, version: str = "v2") -> PolicyRefresh:
    refresh = plan(make_source(fleet, name=name), operator, version)
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    return refresh


def counted_run(simfleet_factory, operator, name: str) -> int:
    """Statements of one whole refresh of a fresh fleet whose updates each take a second."""
    fleet = simfleet_factory(fleet_config(WORKERS))
    slow_updates(fleet, 1.0)
    refresh = started(fleet, operator, name)
    with CaptureQueriesContext(connection) as queries:
        state = execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert state == RefreshState.SUCCEEDED, refresh.held_reason
    return len(queries.captured_queries)


def without_beats(simfleet_factory, operator, monkeypatch) -> int:
    with monkeypatch.context() as m:
        m.setattr(journal, "HEARTBEAT_SECONDS", 3600.0)
        return counted_run(simfleet_factory, operator, "no-beats")


@pytest.mark.parametrize("renewal", [None, 0.25], ids=["no-renewal-due", "renewal-every-250ms"])
def test_a_slow_step_adds_statements_only_for_lease_renewals(
    simfleet_factory, operator, monkeypatch, beats, renewal
):
    baseline = without_beats(simfleet_factory, operator, monkeypatch)
    assert beats["beats"] == 0
    if renewal is not None:
        renew_every(monkeypatch, renewal)
    with_beats = counted_run(simfleet_factory, operator, "beats")
    # The update alone outlasts fifty beats; a second is four renewal intervals.
    assert beats["beats"] >= 10, beats
    if renewal is None:
        assert beats["renewals"] == 0
    else:
        assert 1 <= beats["renewals"] < beats["beats"], beats
    assert with_beats == baseline + beats["renewals"], (baseline, with_beats, beats)


def test_a_stale_abort_signal_costs_one_statement_and_aborts_nothing(
    simfleet_factory, operator, monkeypatch, beats
):
    baseline = without_beats(simfleet_factory, operator, monkeypatch)
    fleet = simfleet_factory(fleet_config(WORKERS))
    slow_updates(fleet, 1.0)
    refresh = started(fleet, operator, "stale")
    # Left by an abort whose flag was reset since (a retry): the database decides.
    abort_signal.send(refresh.pk)
    with CaptureQueriesContext(connection) as queries:
        state = execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert state == RefreshState.SUCCEEDED, refresh.held_reason
    assert not refresh.abort_requested
    assert len(queries.captured_queries) == baseline + 1
    # Withdrawn once refuted: later beats and steps do not pay for it again.
    assert abort_signal.read(refresh.pk) is None


def first_update_in_flight(fleet) -> None:
    """Every update is slowed once; with one call at a time, a consumed fault marks the worker
    whose update is in flight. Waits for it, so what follows happens during the step."""
    keys = [w["key"] for w in fleet.workers()]
    wait_for(
        lambda: any(UPDATE_ROUTE not in fleet.state(key)["faults"] for key in keys), timeout=30
    )


def update_results(refresh) -> dict[str, int]:
    statuses = WorkerStepResult.objects.filter(refresh=refresh, step="update").values_list(
        "status", flat=True
    )
    return {status: list(statuses).count(status) for status in set(statuses)}


def abort_mid_update(simfleet_factory, operator, settings) -> tuple[PolicyRefresh, object]:
    """One worker at a time, each update taking 3 s: abort during the first one. Only a beat
    or the abort watch can bring the abort before it ends (no renewal is due, no outcome
    arrives): the update in flight is cancelled and every other worker is left unreached;
    found any later, the next worker's update would have started."""
    settings.REFRESH_CONCURRENCY = 1
    fleet = simfleet_factory(fleet_config(WORKERS))
    slow_updates(fleet, 3.0)
    refresh = started(fleet, operator, "abort")
    thread, done = execute_in_thread(refresh)
    try:
        first_update_in_flight(fleet)
        intents.abort_policy_refresh(refresh, actor=actor_for(operator))
    finally:
        thread.join(60)
    assert done, "the executor did not finish"
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTED and "aborted by" in refresh.end_reason
    assert update_results(refresh) == {"cancelled": 1, "unreached": WORKERS - 1}
    # Only the first worker was called (its update may still complete on the worker's side).
    assert sum(w["update_count"] for w in fleet.workers()) <= 1
    return refresh, fleet


def test_an_abort_reaches_the_running_step_through_the_redis_signal(
    simfleet_factory, operator, settings, monkeypatch, beats
):
    read = abort_signal.read
    seen: list = []

    def reading(refresh_id):
        value = read(refresh_id)
        seen.append(value)
        return value

    monkeypatch.setattr(abort_signal, "read", reading)
    abort_mid_update(simfleet_factory, operator, settings)
    assert any(seen) and beats["renewals"] == 0
    # (A signal left behind once the flag is reset is refuted and withdrawn by the next reader:
    # `test_a_stale_abort_signal_costs_one_statement_and_aborts_nothing`.)


def test_without_redis_the_heartbeat_reads_the_abort_flag_from_the_database(
    simfleet_factory, operator, settings, monkeypatch, beats
):
    def unreachable(refresh_id):
        raise redis.ConnectionError("Redis is away")

    monkeypatch.setattr(abort_signal, "read", unreachable)
    flushes = {"empty": 0}
    flush = journal.StepJournal.flush

    def counting_flush(self, batch):
        flushes["empty"] += not batch
        flush(self, batch)

    monkeypatch.setattr(journal.StepJournal, "flush", counting_flush)
    abort_mid_update(simfleet_factory, operator, settings)
    assert beats["renewals"] == 0 and flushes["empty"] >= 1


def test_a_lease_taken_over_mid_step_is_found_at_the_next_renewal(
    simfleet_factory, operator, settings, monkeypatch, beats
):
    settings.REFRESH_CONCURRENCY = 1
    renew_every(monkeypatch, 0.1)
    fleet = simfleet_factory(fleet_config(WORKERS))
    slow_updates(fleet, 3.0)
    refresh = started(fleet, operator, "takeover")
    thread, done = execute_in_thread(refresh)
    try:
        first_update_in_flight(fleet)
        # Another executor claims it (the fencing token moves on).
        PolicyRefresh.objects.filter(pk=refresh.pk).update(lease_token=F("lease_token") + 1)
    finally:
        thread.join(60)
    assert done == ["lease_lost"]
    # Found while the first update was in flight: no other worker was called, and the stale
    # executor wrote nothing of the step.
    assert sum(w["update_count"] for w in fleet.workers()) == 1
    assert update_results(refresh) == {}


def test_the_abort_signal_is_sent_only_once_the_abort_commits(operator, simfleet_factory):
    from django.db import transaction

    fleet = simfleet_factory(fleet_config(WORKERS))
    refresh = started(fleet, operator, "commit")
    key = abort_signal.signal_key(refresh.pk)
    assert key.startswith(redis_client.key())
    with transaction.atomic():
        intents.abort_policy_refresh(refresh, actor=actor_for(operator))
        assert abort_signal.read(refresh.pk) is None
    assert abort_signal.read(refresh.pk) is not None
    assert redis_client.sync_client().ttl(key) > 0
