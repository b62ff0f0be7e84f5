"""Journaling a step's calls as they finish: batched, fenced, and published as progress.

Calls run on a helper thread's event loop; finished workers arrive on a queue. This thread
collects them and every FLUSH_INTERVAL (or BATCH outcomes) writes one transaction: the lease
guard (fencing token), then the journal rows and the worker results as plain tuples through
`controlplane.bulk.insert_values`; after it, one aggregated progress event (`refresh.live`).
Between flushes it renews the lease, so a long call (up to the call timeout) never lets the
lease lapse while the executor is alive. Each flush also reads the abort flag, so an abort
reaches the runner within one flush interval.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
from typing import Any

from django.db import transaction

from controlplane.bulk import insert_values
from controlplane.refresh.executor.calls import CallSettings, WorkerJob, WorkerOutcome, run_jobs
from controlplane.refresh.executor.lease import Lease
from controlplane.refresh.live import publish_progress, publish_step_running
from controlplane.refresh.models import JournalEntry, PolicyRefresh, WorkerStepResult

FLUSH_INTERVAL = 0.25
BATCH = 200
_DONE = object()


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
            r.url[:800],
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

    def flush(self, batch: list[WorkerOutcome]) -> None:
        refresh_id, token = self.lease.refresh_id, self.lease.token
        with transaction.atomic():
            self.lease.guard()
            if batch:
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
                            o.error[:2000],
                            o.duration_ms,
                            o.finished_at,
                        )
                        for o in batch
                    ),
                )
            abort = (
                PolicyRefresh.objects.filter(pk=refresh_id)
                .values_list("abort_requested", flat=True)
                .get()
            )
        self.aborted = self.aborted or abort
        if batch:
            self.done += len(batch)
            self.outcomes += batch
            publish_progress(
                refresh_id,
                self.step,
                self.done,
                self.total,
                [cell_payload(o, self.step) for o in batch],
            )


def run_step_calls(
    lease: Lease, step: str, attempt: int, jobs: list[WorkerJob], cfg: CallSettings
) -> StepJournal:
    """Run every job, journaling as they finish. Returns the journal with all outcomes."""
    journal = StepJournal(lease, step, attempt, len(jobs))
    publish_step_running(lease.refresh_id, step, [j.planned_worker_id for j in jobs])
    if not jobs:
        return journal
    outcomes: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(run_jobs(jobs, cfg, emit=outcomes.put, stop=stop))
        except BaseException as exc:  # surfaced to the runner below
            failure.append(exc)
        finally:
            outcomes.put(_DONE)

    # The calls run in this thread's context (the step's trace span, the correlation id).
    thread = threading.Thread(
        target=contextvars.copy_context().run,
        args=(main,),
        name=f"refresh-{lease.refresh_id}-{step}",
        daemon=True,
    )
    thread.start()
    batch: list[WorkerOutcome] = []
    last_flush = time.monotonic()
    finished = False
    try:
        while not finished:
            try:
                item = outcomes.get(timeout=FLUSH_INTERVAL)
            except queue.Empty:
                item = None
            if item is _DONE:
                finished = True
            elif item is not None:
                batch.append(item)
            due = time.monotonic() - last_flush >= FLUSH_INTERVAL
            if finished or len(batch) >= BATCH or due:
                journal.flush(batch)
                batch = []
                last_flush = time.monotonic()
                if journal.aborted:
                    stop.set()
    except BaseException:
        stop.set()  # a lost lease or a database error: stop calling workers at once
        raise
    finally:
        thread.join()
    if failure:
        raise failure[0]
    return journal
