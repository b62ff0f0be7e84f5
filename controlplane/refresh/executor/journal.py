"""Journaling a step's calls as they finish: batched, fenced, and published as progress.

Calls run on the refresh run's event loop (`calls.CallRuntime`); finished workers arrive on a
queue. This thread collects them and writes them in one transaction per flush: the lease guard
(fencing token), then the journal rows and the worker results as plain tuples through
`controlplane.bulk.insert_values` (one COPY each on PostgreSQL); after it, one aggregated
progress event (`refresh.live`).

How often: a flush is due when a step's share of outcomes has arrived (the step's workers
divided into `FLUSHES_PER_STEP` batches), at a heartbeat (every `HEARTBEAT_SECONDS`) that finds
outcomes waiting, and when the calls are over. So a step issues the same statements for 100
workers as for 2,000. A heartbeat with nothing to write issues none, unless:

- the lease is due for renewal (`LEASE_RENEWAL_FRACTION` of it has passed since this process
  last renewed it), so a long call never lets it lapse while the executor is alive;
- the abort signal in Redis is set (`refresh.abort_signal`): the flush's fence reads the
  database flag, which decides, so an abort reaches the runner within a heartbeat;
- Redis cannot be read: then every heartbeat flushes, as all did before the signal, so an
  abort is never missed because Redis is away.

Between heartbeats, while calls are in flight, the abort watch reads the signal alone every
`ABORT_WATCH_SECONDS` (a Redis GET, no SQL unless it is set). A confirmed abort stops new calls
and cancels those in flight (`cancellation.InFlight`), so an abort takes effect within a
fraction of a second rather than when a hung worker's call times out.

Each of those is one statement, `Lease.guard_reading_abort` on its own (no rows to fence, so
no transaction around it): while no call finishes, a slow step costs a statement per renewal,
not one per heartbeat. A lease taken over meanwhile is found
at the next renewal or flush, whichever comes first (a flush's rows are fenced as ever). An
abort whose signal could not be written (Redis away when it was asked) is found the same way.

A transient database failure (a terminated backend, a failover) during a flush or a renewal
runs that fenced transaction again on a new connection, with backoff, for up to
`REFRESH_DB_OUTAGE_SECONDS` (`StepJournal.flush`): the rows of calls already made are written,
the calls are never made again, and no new call starts until they land. Past the bound the
step stops calling and `JournalOutage` carries the unwritten outcomes to the runner's hold.

Nothing here weakens what the journal promises: every outcome is written, fenced, before
`run_step_calls` returns (the step is only judged after that), a stale executor's flush
matches no lease and rolls back whole, and a crash between flushes loses only rows of calls
whose workers have no `ok` result yet, which a takeover treats as unknown (`steps.Update`).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from django.db import transaction

from controlplane import dbretry
from controlplane.bulk import insert_values
from controlplane.refresh import abort_signal
from controlplane.refresh.executor.calls import CallSettings, WorkerJob, WorkerOutcome, run_jobs
from controlplane.refresh.executor.cancellation import InFlight
from controlplane.refresh.executor.lease import Lease
from controlplane.refresh.live import publish_progress, publish_step_running
from controlplane.refresh.models import JournalEntry, WorkerStepResult
from controlplane.textlimits import REASON_CHARS, URL_CHARS

#: Count-based flushes per step, whatever the number of workers.
FLUSHES_PER_STEP = 4
#: How often a step looks for outcomes to write and for an abort (Redis, not SQL).
HEARTBEAT_SECONDS = 1.0
#: How often, between heartbeats, a step with calls in flight reads the abort signal (a Redis
#: GET): an abort cancels the calls within about this much of its commit.
ABORT_WATCH_SECONDS = 0.2
#: Share of the lease after which an idle heartbeat renews it: two thirds of the lease are left
#: to absorb a slow database or a stalled beat before a reconciler may take the refresh over.
LEASE_RENEWAL_FRACTION = 1 / 3
_DONE = object()

logger = logging.getLogger(__name__)


JOURNAL_FIELDS = (
    "refresh",
    "planned_worker",
    "step",
    "operation",
    "method",
    "url",
    "request_body",
    "http_status",
    "response_body",
    "ok",
    "error",
    "duration_ms",
    "attempt",
    "started_at",
    "finished_at",
    "lease_token",
    "cancelled",
    "reached",
)
RESULT_FIELDS = (
    "refresh",
    "planned_worker",
    "step",
    "attempt",
    "status",
    "error",
    "duration_ms",
    "finished_at",
)


def journal_rows(refresh_id, token, step, attempt, outcome: WorkerOutcome) -> list[tuple]:
    """`JOURNAL_FIELDS` values of one worker's calls (plain tuples: a step journals thousands
    of calls, and building model instances for `bulk_create` cost more than inserting them)."""
    return [
        (
            refresh_id,
            outcome.planned_worker_id,
            step,
            r.operation,
            r.method,
            r.url[:URL_CHARS],
            r.request_body,
            r.http_status,
            r.response_body,
            r.ok,
            r.error,
            r.duration_ms,
            attempt,
            r.started_at,
            r.finished_at,
            token,
            r.cancelled,
            r.reached,
        )
        for r in outcome.records
    ]


def cell_payload(outcome: WorkerOutcome, step: str) -> dict[str, Any]:
    return {
        "worker": outcome.planned_worker_id,
        "step": step,
        "status": outcome.status,
        "error": outcome.error,
        "ms": round(outcome.duration_ms, 1),
        "calls": [
            {
                "op": r.operation,
                "ok": r.ok,
                "ms": round(r.duration_ms, 1),
                "at": r.started_at.isoformat(),
            }
            for r in outcome.records
        ],
    }


class StepJournal:
    """Writes one step attempt's outcomes; `aborted` turns true once an abort is seen."""

    def __init__(self, lease: Lease, step: str, attempt: int, total: int) -> None:
        self.lease = lease
        self.step = step
        self.attempt = attempt
        self.total = total
        self.done = 0
        self.aborted = False
        self.outcomes: list[WorkerOutcome] = []
        #: Redis failed this step: heartbeats flush (and warn once) until it answers again.
        self.signal_unreadable = False
        #: Set while a flush retries a failed write: no new call starts until it lands.
        self.calls_paused = threading.Event()

    def flush(self, batch: list[WorkerOutcome], *, maybe_landed: bool = False) -> None:
        """Write `batch` (fenced) and renew the lease, reading the abort flag.

        A transient database failure runs the whole fenced transaction again (`dbretry`): the
        rows are the record of calls already made, so they are written, never the calls made
        again. Meanwhile no new call starts (`calls_paused`), so an outage that outlasts
        `REFRESH_DB_OUTAGE_SECONDS` leaves unwritten only the calls that were in flight.
        `maybe_landed`: the batch was written before by a flush whose outcome is unknown."""
        tries = 0

        def write() -> bool:
            nonlocal tries
            tries += 1
            try:
                return self._write(batch, retried=maybe_landed or tries > 1)
            except Exception:
                self.calls_paused.set()
                raise

        try:
            abort = dbretry.retry(write, what=f"writing the {self.step} journal")
        finally:
            self.calls_paused.clear()
        self.aborted = self.aborted or abort
        if not batch:
            return
        self.done += len(batch)
        self.outcomes += batch
        publish_progress(
            self.lease.refresh_id,
            self.step,
            self.done,
            self.total,
            [cell_payload(o, self.step) for o in batch],
        )

    def _write(self, batch: list[WorkerOutcome], *, retried: bool) -> bool:
        if not batch:
            # Nothing to fence: the renewal and the flag read are one statement on its own,
            # without a transaction's BEGIN and COMMIT round trips.
            return self.lease.guard_reading_abort()
        refresh_id, token = self.lease.refresh_id, self.lease.token
        with transaction.atomic():
            # The fence first (a stale executor's rows must not land), reading the abort flag
            # in the same statement.
            abort = self.lease.guard_reading_abort()
            if retried and self._landed(batch[0]):
                # The connection died after COMMIT reached the server: the rows are there.
                return abort
            rows: list[tuple] = []
            for outcome in batch:
                rows += journal_rows(refresh_id, token, self.step, self.attempt, outcome)
            insert_values(JournalEntry, JOURNAL_FIELDS, rows)
            insert_values(
                WorkerStepResult,
                RESULT_FIELDS,
                (
                    (
                        refresh_id,
                        o.planned_worker_id,
                        self.step,
                        self.attempt,
                        o.status,
                        o.error[:REASON_CHARS],
                        o.duration_ms,
                        o.finished_at,
                    )
                    for o in batch
                ),
            )
        return abort

    def _landed(self, outcome: WorkerOutcome) -> bool:
        """Whether a flush whose outcome was lost with its connection committed (a flush is one
        transaction: its first result stands for all its rows)."""
        return WorkerStepResult.objects.filter(
            refresh_id=self.lease.refresh_id,
            planned_worker_id=outcome.planned_worker_id,
            step=self.step,
            attempt=self.attempt,
            finished_at=outcome.finished_at,
        ).exists()

    def heartbeat(self) -> None:
        """A beat with nothing to write: flush (renew, read the flag) only when needed."""
        lease = self.lease
        if lease.renewal_due(LEASE_RENEWAL_FRACTION):
            self.flush([])
            return
        try:
            signal = abort_signal.read(lease.refresh_id)
        except redis.RedisError:
            if not self.signal_unreadable:
                logger.warning(
                    "policy refresh #%s: abort signal unreadable; reading the flag from the "
                    "database at every heartbeat",
                    lease.refresh_id,
                    exc_info=True,
                )
            self.signal_unreadable = True
            self.flush([])
            return
        self.signal_unreadable = False
        self._confirm(signal)

    def watch_abort(self) -> None:
        """Between heartbeats: read the abort signal only (no SQL unless it is set). Redis
        unreadable is left to the heartbeat, which then reads the database flag."""
        if self.aborted:
            return
        try:
            signal = abort_signal.read(self.lease.refresh_id)
        except redis.RedisError:
            return
        self._confirm(signal)

    def _confirm(self, signal: bytes | str | None) -> None:
        if signal is None:
            return
        self.flush([])
        if not self.aborted:
            # Left by an abort that a retry or the runner since reset: the flag decides.
            abort_signal.withdraw(self.lease.refresh_id, signal)


def _start_calls(
    jobs: list[WorkerJob],
    cfg: CallSettings,
    emit: Callable,
    stop: threading.Event,
    name: str,
    paused: threading.Event | None = None,
    inflight: InFlight | None = None,
) -> Callable[[], BaseException | None]:
    """Start the calls; `_DONE` is emitted when they are over. Returns a function that waits
    for them to be over and gives their failure, if any."""
    coro = run_jobs(jobs, cfg, emit=emit, stop=stop, paused=paused, inflight=inflight)
    if cfg.runtime is not None:
        future = cfg.runtime.submit(coro)
        future.add_done_callback(lambda _f: emit(_DONE))

        def wait_future() -> BaseException | None:
            try:
                future.result()
            except BaseException as exc:  # surfaced to the runner
                return exc
            return None

        return wait_future

    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:  # surfaced to the runner
            failure.append(exc)
        finally:
            emit(_DONE)

    # The calls run in this thread's context (the step's trace span, the correlation id).
    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(main,), name=name, daemon=True
    )
    thread.start()

    def wait_thread() -> BaseException | None:
        thread.join()
        return failure[0] if failure else None

    return wait_thread


class OutcomeChannel:
    """Finished workers, handed from the call thread to the journal thread in batches.

    The calls' event loop appends each outcome (a deque append, no lock, no wake-up); the
    journal thread is woken only when what it waits for is there: a flush's share of outcomes
    (`wake_at`, which it sets before it sleeps) or the end of the calls. Its own timers (the
    abort watch, the heartbeat) wake it meanwhile, and each wake drains everything waiting. A
    wake-up per worker cost a thread switch per worker on both sides, for nothing: the journal
    writes only when a flush is due.
    """

    __slots__ = ("_pending", "_wake", "emitted", "wake_at")

    def __init__(self) -> None:
        self._pending: collections.deque[WorkerOutcome] = collections.deque()
        self._wake: queue.SimpleQueue = queue.SimpleQueue()
        #: Outcomes emitted so far (written by the call thread only).
        self.emitted = 0
        #: Wake the journal thread once `emitted` reaches this (written by the journal thread).
        self.wake_at = 1

    def emit(self, item: object) -> None:
        """Called on the calls' loop with each outcome, and with `_DONE` when they are over."""
        if item is _DONE:
            self._wake.put(_DONE)
            return
        self._pending.append(item)  # type: ignore[arg-type]
        self.emitted += 1
        if self.emitted == self.wake_at:
            self._wake.put(None)

    def wait(self, timeout: float, wake_at: int) -> bool:
        """Sleep until `wake_at` outcomes have been emitted, the calls are over or `timeout`
        passed. Returns True once the calls are over (every outcome is then drainable)."""
        self.wake_at = wake_at
        if self.emitted >= wake_at:
            # Reached before the threshold was set (the emitter saw the old one): no sleep,
            # but take a wake-up token that may be waiting so it does not end a later sleep
            # early (harmless if it does: a wake only drains).
            timeout = 0.0
        try:
            return self._wake.get(timeout=timeout) is _DONE
        except queue.Empty:
            return False

    def drain(self) -> list[WorkerOutcome]:
        pending, taken = self._pending, []
        while pending:
            taken.append(pending.popleft())
        return taken


def run_step_calls(
    lease: Lease, step: str, attempt: int, jobs: list[WorkerJob], cfg: CallSettings
) -> StepJournal:
    """Run every job, journaling as they finish. Returns the journal with all outcomes."""
    journal = StepJournal(lease, step, attempt, len(jobs))
    publish_step_running(lease.refresh_id, step, [j.planned_worker_id for j in jobs])
    if not jobs:
        return journal
    channel = OutcomeChannel()
    stop = threading.Event()
    inflight = InFlight()
    wait = _start_calls(
        jobs,
        cfg,
        channel.emit,
        stop,
        f"refresh-{lease.refresh_id}-{step}",
        journal.calls_paused,
        inflight,
    )
    batch_size = max(1, math.ceil(len(jobs) / FLUSHES_PER_STEP))
    batch: list[WorkerOutcome] = []
    next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
    next_watch = time.monotonic() + ABORT_WATCH_SECONDS
    finished = False
    try:
        while not finished:
            wake = min(next_heartbeat, next_watch)
            # Woken when the next flush's share has been emitted (written + waiting), when
            # the calls are over, or by the nearer timer.
            finished = channel.wait(max(0.0, wake - time.monotonic()), journal.done + batch_size)
            batch += channel.drain()
            if finished and not batch and journal.done == len(jobs):
                break  # the last outcome filled a flush: nothing is left to write
            beat = time.monotonic() >= next_heartbeat
            while len(batch) > batch_size or (len(batch) == batch_size and not finished):
                # Shares of exactly `batch_size`, as when outcomes arrived one by one: the
                # statements of a step stay the same whatever the thread timing.
                journal.flush(batch[:batch_size])
                batch = batch[batch_size:]
                next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
            if finished or len(batch) >= batch_size or (beat and batch):
                journal.flush(batch)
                batch = []
                next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
            elif beat:
                journal.heartbeat()
                next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
            elif not finished and time.monotonic() >= next_watch:
                journal.watch_abort()
            if time.monotonic() >= next_watch or beat:
                next_watch = time.monotonic() + ABORT_WATCH_SECONDS
            if journal.aborted and not stop.is_set():
                # No call starts from now on, then those in flight are cancelled: their
                # workers come back `cancelled`, the rest `unreached`.
                stop.set()
                inflight.cancel()
    except dbretry.DatabaseOutage as outage:
        # The journal stayed unwritable: no further call, and the outcomes of those that were
        # in flight go with the error, for the hold to write once the database answers.
        stop.set()
        wait()
        arrived = channel.drain()
        # `batch` is the flush that failed (its last try may have committed); `arrived` came
        # after it (a heartbeat's flush has no batch).
        raise JournalOutage(outage, journal, [batch, arrived]) from outage
    except BaseException:
        stop.set()  # a lost lease or a database error: stop calling workers at once
        raise
    finally:
        failure = wait()
    if failure is not None:
        raise failure
    return journal


class JournalOutage(dbretry.DatabaseOutage):
    """A `DatabaseOutage` met while journaling a step: `unwritten` are batches of outcomes of
    calls that were made, which `write_unwritten` records (fenced) once the database answers
    again, each checked first for having landed with a commit whose reply was lost."""

    def __init__(
        self,
        outage: dbretry.DatabaseOutage,
        journal: StepJournal,
        unwritten: list[list[WorkerOutcome]],
    ) -> None:
        super().__init__(outage.what, outage.seconds, outage.bound, outage.error)
        self.journal = journal
        self.unwritten = [batch for batch in unwritten if batch]

    def write_unwritten(self) -> None:
        while self.unwritten:
            self.journal.flush(self.unwritten[0], maybe_landed=True)
            self.unwritten.pop(0)
