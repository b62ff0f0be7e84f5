"""Cancelling calls in flight (`executor/cancellation.py`): each comes back `cancelled`, saying
truthfully whether its request had reached the worker.

A real HTTP exchange over a local socket: a "worker" that reads the request and never answers
(reached), and a call held before any connection is made (not reached).
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

from controlplane.refresh.executor.calls import (
    CallRecord,
    CallSettings,
    WorkerJob,
    WorkerOutcome,
    run_jobs,
)
from controlplane.refresh.executor.cancellation import InFlight
from controlplane.refresh.executor.steps import cancelled_summary

PAUSE = {"operation": "pause", "method": "POST", "path": "/engine/pause", "body": {"mode": "keep"}}


class Policy:
    """An outbound policy that admits every URL, or holds the call at its check (`hold`)."""

    def __init__(self, hold: asyncio.Event | None = None) -> None:
        self.hold = hold

    def for_run(self) -> Policy:
        return self

    async def admin_violation(self, system_url: str) -> str | None:
        if self.hold is not None:
            await self.hold.wait()
        return None


async def cancel_when(ready: asyncio.Event, job: WorkerJob, policy: Policy) -> list:
    outcomes: list = []
    stop, inflight = threading.Event(), InFlight()
    cfg = CallSettings(policy=policy, frontend_url="", timeout=30.0, concurrency=2)  # type: ignore[arg-type]
    running = asyncio.ensure_future(
        run_jobs([job], cfg, emit=outcomes.append, stop=stop, inflight=inflight)
    )
    await asyncio.wait_for(ready.wait(), 10)
    stop.set()
    inflight.cancel()
    await asyncio.wait_for(running, 5)  # well inside the 30 s call timeout
    return outcomes


def only_record(outcomes) -> CallRecord:
    (outcome,) = outcomes
    assert outcome.status == "cancelled"
    (record,) = outcome.records
    assert record.cancelled and not record.ok and record.http_status is None
    return record


def test_a_call_whose_request_reached_the_worker_is_cancelled_as_reached():
    async def main() -> list:
        received = asyncio.Event()

        async def silent_worker(reader, writer) -> None:
            await reader.readuntil(b"\r\n\r\n")
            received.set()
            await asyncio.sleep(60)  # hung in its update

        server = await asyncio.start_server(silent_worker, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        job = WorkerJob(1, "w1", f"http://127.0.0.1:{port}", "vllm", [PAUSE])
        try:
            return await cancel_when(received, job, Policy())
        finally:
            server.close()

    record = only_record(asyncio.run(main()))
    assert record.reached is True
    assert "after the request reached the worker (it may have acted on it)" in record.error
    assert record.url.endswith("/engine/pause") and record.operation == "pause"


def test_a_call_cancelled_before_any_byte_was_sent_did_not_reach_the_worker():
    async def main() -> list:
        hold = asyncio.Event()  # never set: the call waits at its policy check
        checking = asyncio.Event()

        class Held(Policy):
            async def admin_violation(self, system_url: str) -> str | None:
                checking.set()
                return await super().admin_violation(system_url)

        # Nothing listens there: had the call gone on, it would have failed to connect.
        job = WorkerJob(1, "w1", "http://127.0.0.1:9", "vllm", [PAUSE])
        return await cancel_when(checking, job, Held(hold))

    record = only_record(asyncio.run(main()))
    assert record.reached is False
    assert "before the request was sent (the worker did not receive it)" in record.error


def test_the_step_reason_counts_cancelled_calls_and_those_that_reached_the_worker():
    def cancelled(reached: bool) -> WorkerOutcome:
        record = only_record_of(reached)
        return WorkerOutcome(1, "w", "cancelled", records=[record])

    def only_record_of(reached: bool) -> CallRecord:
        now = datetime.now(UTC)
        return CallRecord(
            "update_from_disk", "POST", "u", None, None, None, False, "x", 1.0, now, now,
            cancelled=True, reached=reached,
        )  # fmt: skip

    outcomes = [
        cancelled(True),
        cancelled(False),
        cancelled(True),
        WorkerOutcome(4, "d", "unreached"),
        WorkerOutcome(5, "e", "ok"),
    ]
    assert cancelled_summary(outcomes) == (
        "3 calls cancelled (2 had reached the worker), 1 worker not called"
    )
    assert cancelled_summary(outcomes[:1]) == "1 call cancelled (1 had reached the worker)"
