"""One refresh per scope, fencing tokens, crash takeover by the reconciler, real Celery."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import OperationalError, close_old_connections, connection
from django.utils import timezone

from controlplane.refresh import intents
from controlplane.refresh.errors import RefreshConflict
from controlplane.refresh.executor import Lease, LeaseLost, execute_refresh
from controlplane.refresh.models import (
    Gate,
    JournalEntry,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
)
from controlplane.refresh.reconcile import reconcile_policy_refreshes
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    fleet_versions,
    make_source,
    paused_workers,
    plan,
    wait_for,
)


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet, transactional_db):
    return make_source(fleet)


def test_two_concurrent_starts_on_one_scope_yield_exactly_one_refresh(source, operator):
    first, second = plan(source, operator), plan(source, operator)
    barrier = threading.Barrier(2)
    outcomes: dict[int, object] = {}

    def start(refresh):
        try:
            barrier.wait(5)
            intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
            outcomes[refresh.pk] = "started"
        except RefreshConflict as exc:
            outcomes[refresh.pk] = exc
        finally:
            close_old_connections()

    threads = [threading.Thread(target=start, args=(r,)) for r in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)

    assert sorted(str(type(v).__name__) for v in outcomes.values()) == ["RefreshConflict", "str"]
    winner = next(pk for pk, v in outcomes.items() if v == "started")
    loser = next(v for v in outcomes.values() if isinstance(v, RefreshConflict))
    assert loser.active_refresh_id == winner and f"#{winner}" in loser.message
    assert set(ScopeLock.objects.values_list("refresh_id", flat=True)) == {winner}
    assert PolicyRefresh.objects.exclude(state=RefreshState.PLANNED).count() == 1


def started(source, operator, version="v2"):
    refresh = plan(source, operator, version)
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    return refresh


def test_a_stale_fencing_token_cannot_write(source, operator):
    refresh = started(source, operator)
    stale = Lease.claim(refresh.pk, "executor-a")
    PolicyRefresh.objects.filter(pk=refresh.pk).update(lease_expires_at=timezone.now())
    fresh = Lease.claim(refresh.pk, "executor-b")
    assert fresh.token == stale.token + 1 and fresh.takeover

    with pytest.raises(LeaseLost):
        stale.guard(state=RefreshState.SUCCEEDED)
    fresh.guard()  # the current holder still writes
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.GATING and refresh.lease_owner == "executor-b"


def test_a_claim_whose_answer_was_lost_is_taken_by_its_retry_not_refused(source, operator):
    """The claim's UPDATE commits and the connection dies before its answer (a terminated
    backend): the retry finds the lease its own and runs, where it used to answer "not
    claimed" and leave a live lease nobody was running. Another executor's claim made in
    between is still refused."""
    refresh = started(source, operator)
    lost: list[str] = []

    def answer_lost(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not lost and sql.startswith('UPDATE "refresh_policyrefresh"'):
            lost.append(sql)
            raise OperationalError("server closed the connection unexpectedly")
        return result

    with connection.execute_wrapper(answer_lost):
        lease = Lease.claim(refresh.pk, "executor-a")
    assert lost and lease is not None
    refresh.refresh_from_db()
    assert (refresh.lease_token, refresh.lease_owner) == (lease.token, "executor-a")
    assert not lease.takeover
    lease.guard()  # the token is the one written: it still fences
    assert Lease.claim(refresh.pk, "executor-b") is None  # held, and live


def test_a_journal_flush_fence_renews_the_lease_and_reads_the_abort_flag_in_one(source, operator):
    from django.test.utils import CaptureQueriesContext

    refresh = started(source, operator)
    stale = Lease.claim(refresh.pk, "executor-a")
    before = PolicyRefresh.objects.get(pk=refresh.pk).lease_expires_at
    with CaptureQueriesContext(connection) as queries:
        assert stale.guard_reading_abort() is False
    assert len(queries.captured_queries) == 1
    assert PolicyRefresh.objects.get(pk=refresh.pk).lease_expires_at > before
    PolicyRefresh.objects.filter(pk=refresh.pk).update(abort_requested=True)
    assert stale.guard_reading_abort() is True

    PolicyRefresh.objects.filter(pk=refresh.pk).update(lease_expires_at=timezone.now())
    fresh = Lease.claim(refresh.pk, "executor-b")
    with pytest.raises(LeaseLost):
        stale.guard_reading_abort()
    assert fresh.guard_reading_abort() is True


def expire_lease(refresh):
    PolicyRefresh.objects.filter(pk=refresh.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def test_executor_lost_mid_update_is_completed_from_the_journal(fleet, source, operator):
    refresh = started(source, operator)
    # The first executor gets as far as updating and dies with its lease held.
    assert execute_refresh(refresh.pk, stop_after="pause") == "stopped"
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.UPDATING and refresh.lease_owner
    assert len(paused_workers(fleet)) == 6
    # The lease is still live: leave it alone.
    assert reconcile_policy_refreshes(resume=execute_refresh) == []

    expire_lease(refresh)
    assert reconcile_policy_refreshes(resume=execute_refresh) == [refresh.pk]

    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert paused_workers(fleet) == []
    # The vLLM disk update is idempotent, so the new executor re-paused and re-ran it.
    tokens = set(JournalEntry.objects.filter(refresh=refresh).values_list("lease_token", flat=True))
    assert tokens == {1, 2}
    assert refresh.journal.filter(step="pause", lease_token=2).count() == 6


def test_unknown_non_idempotent_update_is_held_not_repeated(fleet, source, operator):
    refresh = started(source, operator)
    execute_refresh(refresh.pk, stop_after="pause")
    # Pretend the target was a distributed update: its group's state is unknown after the
    # executor is lost, so the new executor tears the group down and holds (never repeats).
    PolicyRefresh.objects.filter(pk=refresh.pk).update(
        target={"weight_version": "v2", "method": "distributed", "group": {}, "update": {}}
    )
    expire_lease(refresh)
    reconcile_policy_refreshes(resume=execute_refresh)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.HELD
    assert "executor lost during a distributed update" in refresh.held_reason
    assert all(w["update_count"] == 0 for w in fleet.workers())
    # Still owned: the held refresh keeps the scope and its paused workers.
    assert ScopeLock.objects.filter(refresh=refresh).exists()


def test_celery_worker_runs_the_refresh_and_aborts_it_mid_call(
    fleet, source, operator, celery_worker
):
    refresh = plan(source, operator)
    intents.start_policy_refresh(refresh, actor=actor_for(operator))
    wait_for(lambda: PolicyRefresh.objects.get(pk=refresh.pk).state == RefreshState.SUCCEEDED, 30)
    assert set(fleet_versions(fleet).values()) == {"v2"}

    slow = fleet.workers()[0]["key"]
    fleet.inject(slow, "update_weights_from_disk", Fault.latency(2.0))
    second = plan(source, operator, "v3")
    intents.start_policy_refresh(second, actor=actor_for(operator))
    wait_for(lambda: PolicyRefresh.objects.get(pk=second.pk).state == RefreshState.UPDATING, 30)
    intents.abort_policy_refresh(second, actor=actor_for(operator))
    # The slow update is cancelled in flight (docs/operate/abort.md): well inside its 2 s.
    wait_for(lambda: PolicyRefresh.objects.get(pk=second.pk).state == RefreshState.ABORTED, 1.5)
    second.refresh_from_db()
    assert second.end_reason.startswith("aborted by operator-1: ")
    # Aborted, it frees its scope; nothing was opened.
    assert not ScopeLock.objects.filter(refresh=second).exists()
    assert not any(g.is_open for g in Gate.objects.filter(source=source))
