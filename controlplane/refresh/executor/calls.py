"""Running one step's calls on many workers: concurrent with a bound, sequential per worker.

Runs on its own event loop in a helper thread (see `journal.run_step_calls`), so the Django
thread stays free to batch journal writes while calls are in flight. Each finished worker is
handed over as one `WorkerOutcome`. Before every call the runner looks at `stop`: an abort
stops at the next call boundary and the remaining workers come back `unreached`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controlplane.dynamo.admin import admin_url, call_admin
from controlplane.dynamo.families import FAMILIES, AdminCall, Operation
from controlplane.dynamo.generation import run_generation_check
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.refresh.planning import GENERATION, generation_check_from_call

_UNSET = object()


@dataclass(slots=True)
class CallRecord:
    operation: str
    method: str
    url: str
    request_body: Any
    http_status: int | None
    response_body: Any
    ok: bool
    error: str
    duration_ms: float
    started_at: datetime
    finished_at: datetime


@dataclass(slots=True)
class WorkerJob:
    planned_worker_id: int
    key: str
    system_url: str
    family: str
    calls: list[dict[str, Any]]
    #: For verification: the version `get_weight_version` must read back.
    expect_version: Any = _UNSET


@dataclass(slots=True)
class WorkerOutcome:
    planned_worker_id: int
    key: str
    status: str  # ok | failed | unreached
    error: str = ""
    duration_ms: float = 0.0
    records: list[CallRecord] = field(default_factory=list)
    finished_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True, slots=True)
class CallSettings:
    policy: OutboundPolicy
    frontend_url: str
    timeout: float
    concurrency: int


def _admin_call(spec: dict[str, Any]) -> AdminCall:
    return AdminCall(Operation(spec["operation"]), spec["method"], spec["path"], spec["body"])


async def _run_one(client, cfg: CallSettings, job: WorkerJob, spec: dict[str, Any]) -> CallRecord:
    if spec["operation"] == GENERATION:
        check = generation_check_from_call(spec)
        started = datetime.now(UTC)
        t0 = time.perf_counter()
        verdict = await run_generation_check(
            client, cfg.policy, cfg.frontend_url, check, timeout=cfg.timeout
        )
        return CallRecord(
            operation=GENERATION,
            method="POST",
            url=cfg.frontend_url.rstrip("/") + "/v1/completions",
            request_body=spec["body"],
            http_status=verdict.http_status,
            response_body=verdict.body,
            ok=verdict.ok,
            error=verdict.reason or "",
            duration_ms=(time.perf_counter() - t0) * 1000.0,
            started_at=started,
            finished_at=datetime.now(UTC),
        )
    call = _admin_call(spec)
    family = FAMILIES[job.family]
    result = await call_admin(client, cfg.policy, job.system_url, family, call, timeout=cfg.timeout)
    ok, error = result.ok, result.error or ""
    if ok and call.operation == Operation.GET_WEIGHT_VERSION and job.expect_version is not _UNSET:
        data = result.data or {}
        if data.get("version") != job.expect_version or not data.get("version_declared"):
            ok = False
            error = (
                f"version readback {data.get('version')!r} is not the target {job.expect_version!r}"
            )
    return CallRecord(
        operation=call.operation.value,
        method=call.method,
        url=admin_url(job.system_url, call),
        request_body=call.body,
        http_status=result.http_status,
        response_body=result.body,
        ok=ok,
        error=error,
        duration_ms=result.duration_ms,
        started_at=result.started_at,
        finished_at=result.finished_at,
    )


async def run_jobs(
    jobs: list[WorkerJob],
    cfg: CallSettings,
    *,
    emit: Callable[[WorkerOutcome], None],
    stop: threading.Event,
) -> None:
    semaphore = asyncio.Semaphore(cfg.concurrency)
    # The generation checks go to the frontend, so allow a connection or two beyond the bound.
    async with make_client(timeout=cfg.timeout, max_connections=cfg.concurrency + 2) as client:

        async def run(job: WorkerJob) -> None:
            async with semaphore:
                t0 = time.perf_counter()
                outcome = WorkerOutcome(job.planned_worker_id, job.key, "ok")
                for spec in job.calls:
                    if stop.is_set():
                        outcome.status = "unreached"
                        outcome.error = "stopped before this call (abort requested)"
                        break
                    record = await _run_one(client, cfg, job, spec)
                    outcome.records.append(record)
                    if not record.ok:
                        outcome.status = "failed"
                        outcome.error = f"{spec['operation']}: {record.error}"
                        break
                outcome.duration_ms = (time.perf_counter() - t0) * 1000.0
                outcome.finished_at = datetime.now(UTC)
                emit(outcome)

        await asyncio.gather(*(run(job) for job in jobs))
