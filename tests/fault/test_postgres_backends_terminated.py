"""PostgreSQL backends terminated under running policy refreshes and web requests.

The backends of the test database are killed from a connection of their own
(`pg_terminate_backend`, as a failover or a restart would), at chosen points — inside a
journal write, right before a lease renewal — and at random, while three refreshes run on
simulated fleets. A transient failure must never need a person: every refresh ends
`succeeded`, none holds, no worker stays paused, and no admin call is made twice because a
write of its record failed. Only an outage longer than `REFRESH_DB_OUTAGE_SECONDS` holds, and
its reason says the database was unreachable. The web pool hands out no dead connection.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client

from controlplane import dbpool, dbretry
from controlplane.refresh import abort_signal, intents
from controlplane.refresh.executor import journal, runner
from controlplane.refresh.executor.lease import Lease
from controlplane.refresh.models import (
    EXECUTING_STATES,
    JournalEntry,
    PolicyRefresh,
    RefreshState,
    WorkerStepResult,
)
from controlplane.refresh.tasks import execute_policy_refresh
from controlplane.simfleet import Fault
from tests.fixtures.live_server import _database_url as live_server_database_url
from tests.integration.refresh.helpers import (
    actor_for,
    execute_in_thread,
    fleet_config,
    make_source,
    paused_workers,
    plan,
    wait_for,
)
from tests.postgres import postgres_only

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]

UPDATE_ROUTE = "update_weights_from_disk"


def _admin_connection() -> psycopg.Connection:
    """A connection to the server's `postgres` database: it survives the terminations."""
    params = connection.settings_dict
    return psycopg.connect(
        host=params["HOST"] or "127.0.0.1",
        port=int(params["PORT"] or 5432),
        user=params["USER"] or "postgres",
        password=params["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )


class Terminator:
    """Kills every backend of this run's test database (never another database's)."""

    def __init__(self) -> None:
        self.database = connection.settings_dict["NAME"]
        assert self.database.startswith("test_"), self.database
        self._admin = _admin_connection()
        self._lock = threading.Lock()
        self.rounds = 0
        self.killed = 0

    def __call__(self) -> int:
        with self._lock:
            rows = self._admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [self.database],
            ).fetchall()
            self.rounds += 1
            self.killed += sum(1 for (ok,) in rows if ok)
            return len(rows)

    def allow_connections(self, allowed: bool) -> None:
        with self._lock:
            self._admin.execute(
                f'ALTER DATABASE "{self.database}" WITH ALLOW_CONNECTIONS {str(allowed).lower()}'
            )

    def close(self) -> None:
        self._admin.close()


@pytest.fixture
def terminate() -> Iterator[Terminator]:
    terminator = Terminator()
    try:
        yield terminator
    finally:
        terminator.allow_connections(True)
        terminator.close()
        # This thread's connection was killed as well: the next test starts on a fresh one.
        connection.close()


def started_refresh(simfleet_factory, operator, name: str, workers: int = 4):
    fleet = simfleet_factory(fleet_config(workers, seed=hash(name) % 1000))
    refresh = plan(make_source(fleet, name=name), operator, "v2")
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    return refresh, fleet


def calls_per_attempt(refresh) -> collections.Counter:
    """Journal rows per (worker, step, attempt, operation): each admin call of an attempt is
    written once."""
    return collections.Counter(
        JournalEntry.objects.filter(refresh=refresh).values_list(
            "planned_worker_id", "step", "attempt", "operation"
        )
    )


def test_refreshes_ride_out_terminated_backends(
    simfleet_factory, operator, monkeypatch, settings, terminate, fault_report
):
    settings.REFRESH_DB_OUTAGE_SECONDS = 20.0
    # Beats and renewals every few tens of milliseconds, so renewals happen during the steps.
    monkeypatch.setattr(journal, "HEARTBEAT_SECONDS", 0.02)
    monkeypatch.setattr(journal, "LEASE_RENEWAL_FRACTION", 0.05 / settings.REFRESH_LEASE_SECONDS)
    # One flush per outcome: more journal writes to cut.
    monkeypatch.setattr(journal, "FLUSHES_PER_STEP", 10_000)
    runs = [started_refresh(simfleet_factory, operator, f"pg-{i}") for i in range(3)]
    for _, fleet in runs:
        for worker in fleet.workers():
            fleet.inject(worker["key"], UPDATE_ROUTE, Fault.latency(0.3, once=True))

    cuts = collections.Counter()
    lock = threading.Lock()

    def cut(where: str, every: int) -> bool:
        with lock:
            cuts[f"seen:{where}"] += 1
            due = cuts[f"seen:{where}"] % every == 1
            if due:
                cuts[where] += 1
        return due

    insert_values = journal.insert_values

    def insert_cut(model, fields, rows):
        # Inside the flush's transaction, after its fence: the write itself is cut.
        if model is JournalEntry and cut("journal_write", 4):
            terminate()
        return insert_values(model, fields, rows)

    guard_reading_abort = Lease.guard_reading_abort

    def renewal_cut(self):
        # A heartbeat's renewal runs on its own, outside a transaction.
        if not connection.in_atomic_block and cut("lease_renewal", 3):
            terminate()
        return guard_reading_abort(self)

    monkeypatch.setattr(journal, "insert_values", insert_cut)
    monkeypatch.setattr(Lease, "guard_reading_abort", renewal_cut)

    stop = threading.Event()

    def at_random() -> None:
        while not stop.wait(0.25):
            terminate()

    threads = [execute_in_thread(refresh) for refresh, _ in runs]
    chaos = threading.Thread(target=at_random, daemon=True)
    chaos.start()
    try:
        for thread, _ in threads:
            thread.join(50)
    finally:
        stop.set()
        chaos.join(5)
    connection.close()
    assert all(done for _, done in threads), "an executor did not finish"

    held = 0
    for (refresh, fleet), (_, done) in zip(runs, threads, strict=True):
        refresh.refresh_from_db()
        held += refresh.state == RefreshState.HELD
        assert done == [RefreshState.SUCCEEDED], (done, refresh.state, refresh.held_reason)
        assert paused_workers(fleet) == []
        # No call made twice: the fleet saw one update per worker, the journal one row per
        # call of each attempt.
        assert [w["update_count"] for w in fleet.workers()] == [1] * len(fleet.workers())
        repeated = {k: n for k, n in calls_per_attempt(refresh).items() if n > 1}
        assert not repeated, repeated
    assert cuts["journal_write"] >= 2 and cuts["lease_renewal"] >= 2, cuts
    fault_report(
        refreshes=len(runs),
        held_by_transient=held,
        unowned_paused=sum(len(paused_workers(fleet)) for _, fleet in runs),
        terminations=terminate.rounds,
        backends_killed=terminate.killed,
        cut_journal_writes=cuts["journal_write"],
        cut_lease_renewals=cuts["lease_renewal"],
    )


def test_an_outage_past_the_bound_holds_naming_the_database(
    simfleet_factory, operator, monkeypatch, settings, terminate, fault_report
):
    settings.REFRESH_DB_OUTAGE_SECONDS = 1.5
    # A refused connection would keep each attempt in the pool's queue for its whole timeout.
    monkeypatch.setattr(connection.pool, "timeout", 0.3)
    refresh, fleet = started_refresh(simfleet_factory, operator, "pg-long")
    for worker in fleet.workers():
        fleet.inject(worker["key"], UPDATE_ROUTE, Fault.latency(0.3, once=True))

    insert_values = journal.insert_values
    cut = threading.Event()

    def outage_at_first_write(model, fields, rows):
        # The update's first journal write meets a database that refuses every connection
        # (rows are tuples in `JOURNAL_FIELDS` order: the step is the third).
        if model is JournalEntry and rows[0][2] == "update" and not cut.is_set():
            cut.set()
            terminate.allow_connections(False)
            terminate()
        return insert_values(model, fields, rows)

    monkeypatch.setattr(journal, "insert_values", outage_at_first_write)
    thread, done = execute_in_thread(refresh)
    try:
        wait_for(cut.is_set, timeout=30)
        started = time.monotonic()
        # The outage: a second past the bound, then the database answers again.
        time.sleep(settings.REFRESH_DB_OUTAGE_SECONDS + 1.0)
        outage = time.monotonic() - started
    finally:
        terminate.allow_connections(True)
        thread.join(40)
    connection.close()
    assert done == [RefreshState.HELD], done
    refresh = PolicyRefresh.objects.get(pk=refresh.pk)
    assert refresh.state == RefreshState.HELD
    assert refresh.held_reason.startswith("database unreachable for "), refresh.held_reason
    assert "REFRESH_DB_OUTAGE_SECONDS=1.5" in refresh.held_reason
    assert "writing the update journal" in refresh.held_reason
    # The calls made before and during the outage are in the journal, once each.
    updated = {w["identity"] for w in fleet.workers() if w["update_count"]}
    journaled = set(
        JournalEntry.objects.filter(refresh=refresh, step="update").values_list(
            "planned_worker__key", flat=True
        )
    )
    assert updated and updated == journaled, (updated, journaled)
    repeated = {k: n for k, n in calls_per_attempt(refresh).items() if n > 1}
    assert not repeated, repeated
    fault_report(refreshes=1, held_by_outage=1, outage_seconds=round(outage, 1))


def test_an_outage_longer_than_the_lease_stops_the_executor_at_its_fence(
    simfleet_factory, operator, monkeypatch, settings, terminate, fault_report
):
    """The outage outlasts the lease and another executor takes the refresh over: when the
    database answers, the first one's retried journal write meets the fence and it stops,
    writing nothing; the new owner finishes the refresh."""
    settings.REFRESH_DB_OUTAGE_SECONDS = 30.0
    settings.REFRESH_LEASE_SECONDS = 1.0
    monkeypatch.setattr(connection.pool, "timeout", 0.3)
    refresh, fleet = started_refresh(simfleet_factory, operator, "pg-takeover")
    failing, taken_over = threading.Event(), threading.Event()
    insert_values = journal.insert_values

    def outage_at_update_write(model, fields, rows):
        if model is JournalEntry and rows[0][2] == "update" and not failing.is_set():
            terminate.allow_connections(False)
            terminate()
        return insert_values(model, fields, rows)

    failed = dbretry.Outage.failed

    def failed_until_taken_over(self, exc, what):
        # The first executor's retries wait out the takeover (the outage as it sees it).
        failing.set()
        taken_over.wait(30)
        return failed(self, exc, what)

    monkeypatch.setattr(journal, "insert_values", outage_at_update_write)
    monkeypatch.setattr(dbretry.Outage, "failed", failed_until_taken_over)
    thread, done = execute_in_thread(refresh)
    try:
        wait_for(failing.is_set, timeout=30)
        terminate.allow_connections(True)
        connection.close()
        first_token = PolicyRefresh.objects.get(pk=refresh.pk).lease_token
        # Another executor, once the first one's lease has lapsed.
        takeover = wait_for(lambda: Lease.claim(refresh.pk, owner="takeover"), timeout=10)
    finally:
        terminate.allow_connections(True)
        taken_over.set()
        thread.join(30)
    assert done == ["lease_lost"], done
    # Nothing of the first executor's update landed: its flush was fenced out.
    assert not JournalEntry.objects.filter(refresh=refresh, step="update").exists()
    assert takeover.token == first_token + 1
    monkeypatch.setattr(dbretry.Outage, "failed", failed)
    assert runner.Runner(takeover).run() == RefreshState.SUCCEEDED
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    # The new owner repeated the (idempotent) disk update whose outcome it could not know.
    assert JournalEntry.objects.filter(refresh=refresh, step="update", lease_token=first_token + 1)
    assert paused_workers(fleet) == []
    fault_report(refreshes=1, lease_lost=1, stale_rows_written=0)


def test_an_abort_is_heard_through_a_renewal_cut_by_a_termination(
    simfleet_factory, operator, monkeypatch, settings, terminate, fault_report
):
    """The abort signal's confirmation is the heartbeat's fenced read of the flag: its
    connection killed, the read is retried and the abort still stops the step at once."""
    settings.REFRESH_CONCURRENCY = 1
    monkeypatch.setattr(journal, "HEARTBEAT_SECONDS", 0.02)
    refresh, fleet = started_refresh(simfleet_factory, operator, "pg-abort", workers=4)
    for worker in fleet.workers():
        fleet.inject(worker["key"], UPDATE_ROUTE, Fault.latency(2.0, once=True))
    guard_reading_abort = Lease.guard_reading_abort
    cut = threading.Event()

    def cut_once(self):
        # The heartbeat's confirmation of a signalled abort (outside a transaction).
        signalled = abort_signal.read(self.refresh_id)
        if signalled and not connection.in_atomic_block and not cut.is_set():
            cut.set()
            terminate()
        return guard_reading_abort(self)

    monkeypatch.setattr(Lease, "guard_reading_abort", cut_once)
    thread, done = execute_in_thread(refresh)
    try:
        keys = [w["key"] for w in fleet.workers()]
        # The first update is in flight once its one-off latency has been consumed.
        wait_for(
            lambda: any(UPDATE_ROUTE not in fleet.state(k)["faults"] for k in keys), timeout=30
        )
        intents.abort_policy_refresh(refresh, actor=actor_for(operator))
    finally:
        thread.join(40)
    connection.close()
    assert cut.is_set()
    assert done == [RefreshState.ABORTED], done
    refresh.refresh_from_db()
    assert "aborted by" in refresh.end_reason, refresh.end_reason
    # Heard during the first update (cancelled in flight): no other worker was called.
    assert sum(w["update_count"] for w in fleet.workers()) <= 1
    statuses = WorkerStepResult.objects.filter(refresh=refresh, step="update")
    assert sorted(statuses.values_list("status", flat=True)) == ["cancelled"] + ["unreached"] * 3
    fault_report(refreshes=1, aborts_heard=1, terminations=terminate.rounds)


def test_a_failed_step_whose_hold_is_cut_holds_without_calling_again(
    simfleet_factory, operator, monkeypatch, terminate, fault_report
):
    """A worker's update fails; the hold's transaction loses its connection. The hold is
    written on a new one — the failing worker is not called again without a person."""
    refresh, fleet = started_refresh(simfleet_factory, operator, "pg-failed", workers=4)
    failing = fleet.workers()[0]
    fleet.inject(failing["key"], UPDATE_ROUTE, Fault.error("disk full"))
    hold = runner.Runner._hold
    cuts: list[str] = []

    def cut_hold(self, refresh, step, reason, step_run, **kwargs):
        if not cuts:
            cuts.append(reason)
            terminate()
        return hold(self, refresh, step, reason, step_run, **kwargs)

    monkeypatch.setattr(runner.Runner, "_hold", cut_hold)
    thread, done = execute_in_thread(refresh)
    thread.join(40)
    connection.close()
    assert cuts and done == [RefreshState.HELD], (cuts, done)
    refresh.refresh_from_db()
    assert refresh.failed_step == "update" and "disk full" in refresh.held_reason
    update_calls = [c for c in fleet.state(failing["key"])["calls"] if c["route"] == UPDATE_ROUTE]
    assert len(update_calls) == 1, update_calls
    fault_report(refreshes=1, held_by_step_failure=1, repeated_calls=len(update_calls) - 1)


def test_a_failed_step_cut_before_its_judgement_holds_without_calling_again(
    simfleet_factory, operator, monkeypatch, terminate, fault_report
):
    """A worker's update fails, and the runner's next read (before it acts on the failure)
    loses its connection: the runner holds on the failure instead of running the step again."""
    refresh, fleet = started_refresh(simfleet_factory, operator, "pg-unjudged", workers=4)
    failing = fleet.workers()[0]
    fleet.inject(failing["key"], UPDATE_ROUTE, Fault.error("disk full"))
    run_step, load = runner.Runner._run_step, runner.Runner.load
    armed, cuts = threading.Event(), []

    def arming_run_step(self, refresh, step):
        ran = run_step(self, refresh, step)
        if not ran[0].ok and not cuts:  # (result, step run, context)
            armed.set()
        return ran

    def cut_load(self):
        if armed.is_set():
            armed.clear()
            cuts.append(1)
            terminate()
        return load(self)

    monkeypatch.setattr(runner.Runner, "_run_step", arming_run_step)
    monkeypatch.setattr(runner.Runner, "load", cut_load)
    thread, done = execute_in_thread(refresh)
    thread.join(40)
    connection.close()
    assert cuts and done == [RefreshState.HELD], (cuts, done)
    refresh.refresh_from_db()
    assert refresh.failed_step == "update" and "disk full" in refresh.held_reason
    update_calls = [c for c in fleet.state(failing["key"])["calls"] if c["route"] == UPDATE_ROUTE]
    assert len(update_calls) == 1, update_calls
    fault_report(refreshes=1, held_by_step_failure=1, repeated_calls=len(update_calls) - 1)


def test_the_web_pool_checks_connections_before_use(settings):
    assert settings.DATABASES["default"]["OPTIONS"]["pool"]["check"] is dbpool.check_connection
    # Django hands the options to the pool it builds.
    assert connection.pool._check is dbpool.check_connection


@pytest.fixture
def operator_cookies(operator) -> dict[str, str]:
    client = Client()
    client.force_login(operator)
    name = django_settings.SESSION_COOKIE_NAME
    return {name: client.cookies[name].value}


def test_requests_after_terminated_backends_answer(
    live_server_url, operator_cookies, terminate, fault_report
):
    """The live ASGI server is a web process: its connections come from the pool. Each round
    fills the pool with idle connections, kills them, and asks again."""
    statuses: collections.Counter = collections.Counter()

    def get(client: httpx.Client) -> None:
        statuses[client.get("/refreshes/").status_code] += 1

    with httpx.Client(base_url=live_server_url, cookies=operator_cookies, timeout=30) as client:
        for _ in range(3):
            with concurrent.futures.ThreadPoolExecutor(8) as burst:
                list(burst.map(lambda _: get(client), range(16)))
            terminate()
            for _ in range(20):
                get(client)
    assert statuses == {200: 108}, statuses
    fault_report(
        requests=statuses.total(),
        server_errors=statuses.total() - statuses[200],
        terminations=terminate.rounds,
        backends_killed=terminate.killed,
    )


@contextlib.contextmanager
def celery_process(log_path, queue: str) -> Iterator[subprocess.Popen]:
    """`celery -A controlplane worker` as production runs it: its own process, a Celery
    process kind (persistent connections, health-checked), on the test database."""
    env = dict(
        os.environ,
        DATABASE_URL=live_server_database_url(),
        CONTROLPLANE_PROCESS="celery",
    )
    command = [
        sys.executable,
        *("-m", "celery", "-A", "controlplane", "worker", "-P", "threads", "-c", "2"),
        *("-Q", queue, "-l", "INFO", "--without-mingle", "--without-gossip"),
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"ready." in log_path.read_bytes() or process.poll() is not None, 60)
        assert process.poll() is None, log_path.read_text()
        yield process
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


def state_of(refresh) -> str:
    # This thread's connection is killed with the others: reconnect as the executor does.
    return dbretry.retry(
        lambda: PolicyRefresh.objects.values_list("state", flat=True).get(pk=refresh.pk),
        what="reading the refresh",
    )


def test_a_celery_worker_rides_out_terminated_backends(
    simfleet_factory, operator, settings, terminate, fault_report, tmp_path
):
    """The executor in a real Celery worker: backends killed during its task, and again
    between tasks (the worker's kept connection is dead when the next task starts)."""
    settings.REFRESH_DB_OUTAGE_SECONDS = 20.0
    queue = f"pgretry-{uuid.uuid4().hex[:12]}"
    runs = [started_refresh(simfleet_factory, operator, f"celery-{i}") for i in range(2)]
    for _, fleet in runs:
        for worker in fleet.workers():
            fleet.inject(worker["key"], UPDATE_ROUTE, Fault.latency(1.0, once=True))
    log = tmp_path / "celery.log"
    states, during = [], []
    with celery_process(log, queue):
        for refresh, _ in runs:
            terminate()  # between tasks: the worker's connection from the last one is dead
            execute_policy_refresh.apply_async(args=[refresh.pk], queue=queue)
            deadline = time.monotonic() + 40
            during.append(0)
            while state_of(refresh) in EXECUTING_STATES:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                terminate()  # during the task
                during[-1] += 1
                time.sleep(0.3)
            states.append(state_of(refresh))
    connection.close()
    assert states == [RefreshState.SUCCEEDED] * len(runs), (states, log.read_text()[-3000:])
    # A second of updates alone: every task met several terminations while it ran.
    assert min(during) >= 3, during
    for _, fleet in runs:
        assert paused_workers(fleet) == []
        assert [w["update_count"] for w in fleet.workers()] == [1] * len(fleet.workers())
    fault_report(
        refreshes=len(runs),
        held_by_transient=states.count(RefreshState.HELD),
        terminations=terminate.rounds,
        terminations_during_tasks=sum(during),
        backends_killed=terminate.killed,
    )
