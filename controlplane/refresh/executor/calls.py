"""Running one step's calls on many workers: concurrent with a bound, sequential per worker.

Calls run on an event loop in a helper thread, so the Django thread stays free to batch journal
writes while calls are in flight (see `journal.run_step_calls`). Each finished worker is handed
over as one `WorkerOutcome`. Before every call the runner looks at `stop`, and an abort also
cancels the calls in flight (`cancellation.InFlight`): a cancelled call is journaled as such,
saying whether its request had reached the worker, its worker comes back `cancelled`, and the
workers not yet called come back `unreached`.

A refresh run keeps one `CallRuntime` from its first step to its last: one event loop thread,
one HTTP client whose pool is sized to the concurrency bound (connections stay open from step
to step), one policy made for the run (each worker origin judged once, see
`OutboundPolicy.for_run`), the admin calls of each operation built and encoded once (the plan
gives every worker the same call; only the URL differs) and each distinct reply decoded once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controlplane.bulk import JsonText
from controlplane.dynamo.admin import PreparedCall, ReplyCache, admin_url, exchange
from controlplane.dynamo.families import AdminCall, Operation, for_release
from controlplane.dynamo.generation import run_generation_check
from controlplane.dynamo.http import DynamoClient, make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.dynamo.releases import DECLARED_REQUIRED, declared_ok
from controlplane.refresh.executor.cancellation import (
    CallProgress,
    InFlight,
    TrackedRequest,
    cancelled_error,
    track,
)
from controlplane.refresh.executor.heap import settle_long_lived_heap
from controlplane.refresh.planning import GENERATION, generation_check_from_call

_UNSET = object()
#: How often a call held while the journal cannot be written looks again.
PAUSED_POLL_SECONDS = 0.05


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
    #: An abort cancelled the call; `reached` says whether its request had been written to the
    #: worker's connection (see `cancellation`). None for a call that was not cancelled.
    cancelled: bool = False
    reached: bool | None = None


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
    status: str  # ok | failed | unreached | cancelled
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
    #: The Dynamo release of the source's workers: its contract's success rules judge the
    #: replies (`families.for_release`); blank = the default release.
    release: str = ""
    #: The refresh run's loop and client; None: each step gets a loop and client of its own.
    runtime: CallRuntime | None = field(default=None, compare=False)


#: Distinct calls one run keeps prepared (a plan has a handful per step; per-worker bodies,
#: should a method need them, simply stop being shared beyond this).
TEMPLATE_LIMIT = 4096


class CallTemplates:
    """Each distinct planned call built once per run: the `AdminCall`, its encoded body for the
    wire and its serialised body for the journal. Keyed by the call's JSON text, so two calls
    share a template only when they would send the very same bytes (Python equality would
    merge `1` and `true`)."""

    __slots__ = ("_prepared",)

    def __init__(self) -> None:
        self._prepared: dict[str, tuple[PreparedCall, JsonText | None]] = {}

    def get(self, spec: dict[str, Any]) -> tuple[PreparedCall, JsonText | None]:
        # json.dumps with its default options reuses one encoder; any other option builds an
        # encoder per call, which cost more than the rest of the lookup.
        key = json.dumps((spec["operation"], spec["method"], spec["path"], spec["body"]))
        known = self._prepared.get(key)
        if known is not None:
            return known
        prepared = PreparedCall.of(
            AdminCall(Operation(spec["operation"]), spec["method"], spec["path"], spec["body"])
        )
        body = None if prepared.body_json is None else JsonText(prepared.body_json)
        if len(self._prepared) >= TEMPLATE_LIMIT:
            self._prepared.clear()
        self._prepared[key] = (prepared, body)
        return prepared, body


@dataclass(slots=True)
class _RunState:
    """What the calls of one run share; lives on the run's event loop."""

    client: DynamoClient
    policy: OutboundPolicy
    templates: CallTemplates = field(default_factory=CallTemplates)
    replies: ReplyCache = field(default_factory=ReplyCache)


class CallRuntime:
    """One event loop thread and one HTTP client for a whole refresh run.

    `with CallRuntime(...) as runtime:` starts the loop and opens the client (pool sized to the
    concurrency bound, plus two for the generation checks to the frontend); `submit` runs a
    coroutine there; leaving closes the client and stops the thread. Steps hand over through
    `CallSettings.runtime`.
    """

    def __init__(self, policy: OutboundPolicy, *, timeout: float, concurrency: int) -> None:
        self.policy = policy.for_run()
        self.timeout = timeout
        self.concurrency = concurrency
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="refresh-calls")
        self._thread.daemon = True
        self.state: _RunState | None = None

    def __enter__(self) -> CallRuntime:
        # The first run of a process takes the process's long-lived objects out of the
        # collector's way (see heap.py); later runs find it done.
        settle_long_lived_heap()
        self._thread.start()
        try:
            self.state = self.submit(self._open()).result()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self.state is not None:
                self.submit(self.state.client.aclose()).result()
        finally:
            self._stop()

    async def _open(self) -> _RunState:
        client = make_client(
            timeout=self.timeout,
            max_connections=self.concurrency + 2,
            request_class=TrackedRequest,
        )
        await client.__aenter__()
        return _RunState(client, self.policy)

    def _stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        # The calls run in the submitting thread's context (the step's trace span, the
        # correlation id), not in the runtime thread's own.
        return asyncio.run_coroutine_threadsafe(
            _in_context(coro, contextvars.copy_context()), self.loop
        )


async def _in_context(coro: Coroutine[Any, Any, Any], context: contextvars.Context) -> Any:
    return await asyncio.get_running_loop().create_task(coro, context=context)


async def _run_one(
    run: _RunState, cfg: CallSettings, job: WorkerJob, spec: dict[str, Any], progress: list
):
    # Tracked in this call's own task: `TrackedRequest` reads it from the task's context.
    progress.append(track())
    if spec["operation"] == GENERATION:
        check = generation_check_from_call(spec)
        started = datetime.now(UTC)
        t0 = time.perf_counter()
        verdict = await run_generation_check(
            run.client, run.policy, cfg.frontend_url, check, timeout=cfg.timeout
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
    prepared, request_body = run.templates.get(spec)
    call = prepared.call
    url = admin_url(job.system_url, call)
    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    # `exchange` rather than `call_admin`: the journal's record is built straight from the
    # judged reply (an intermediate result per call was measurable at thousands of calls).
    status, (ok, body, error, data) = await exchange(
        run.client,
        run.policy,
        job.system_url,
        url,
        for_release(job.family, cfg.release),
        prepared,
        timeout=cfg.timeout,
        replies=run.replies,
    )
    duration_ms = (time.perf_counter() - t0) * 1000.0
    finished_at = datetime.now(UTC)
    if ok and call.operation == Operation.GET_WEIGHT_VERSION and job.expect_version is not _UNSET:
        data = data or {}
        if data.get("version") != job.expect_version:
            ok = False
            error = (
                f"version readback {data.get('version')!r} is not the target {job.expect_version!r}"
            )
        elif not declared_ok(spec.get("declared", DECLARED_REQUIRED), data.get("version_declared")):
            ok = False
            error = (
                f"version readback {data.get('version')!r} is not declared "
                f"(version_declared {data.get('version_declared')!r})"
            )
    return CallRecord(
        operation=call.operation.value,
        method=call.method,
        url=url,
        request_body=request_body,
        http_status=status,
        response_body=body,
        ok=ok,
        error=error or "",
        duration_ms=duration_ms,
        started_at=started_at,
        finished_at=finished_at,
    )


async def run_jobs(
    jobs: list[WorkerJob],
    cfg: CallSettings,
    *,
    emit: Callable[[WorkerOutcome], None],
    stop: threading.Event,
    paused: threading.Event | None = None,
    inflight: InFlight | None = None,
) -> None:
    """`paused`, while set, holds every call not yet started (the journal cannot be written:
    see `journal.StepJournal.flush`); `stop` still ends the wait. `inflight.cancel()` (set
    `stop` first) cancels the calls in flight."""
    inflight = inflight or InFlight()
    inflight.bind(asyncio.get_running_loop())
    runtime = cfg.runtime
    if runtime is not None and runtime.state is not None and cfg.concurrency <= runtime.concurrency:
        await _run_jobs(
            runtime.state, jobs, cfg, emit=emit, stop=stop, paused=paused, inflight=inflight
        )
        return
    # No run runtime (a step run on its own), or a step that needs more calls in flight than
    # the run's pool holds — a collective group's join, where every rank must be in flight at
    # once or none completes: a client for this step only, sized to its bound.
    # The generation checks go to the frontend, so allow a connection or two beyond the bound.
    async with make_client(
        timeout=cfg.timeout,
        max_connections=cfg.concurrency + 2,
        request_class=TrackedRequest,
    ) as client:
        await _run_jobs(
            _RunState(client, cfg.policy.for_run()),
            jobs,
            cfg,
            emit=emit,
            stop=stop,
            paused=paused,
            inflight=inflight,
        )


async def _run_jobs(
    state: _RunState,
    jobs: list[WorkerJob],
    cfg: CallSettings,
    *,
    emit: Callable[[WorkerOutcome], None],
    stop: threading.Event,
    paused: threading.Event | None = None,
    inflight: InFlight,
) -> None:
    semaphore = asyncio.Semaphore(cfg.concurrency)

    async def run(job: WorkerJob) -> None:
        async with semaphore:
            t0 = time.perf_counter()
            outcome = WorkerOutcome(job.planned_worker_id, job.key, "ok")
            for spec in job.calls:
                while paused is not None and paused.is_set() and not stop.is_set():
                    await asyncio.sleep(PAUSED_POLL_SECONDS)
                if stop.is_set():
                    outcome.status = "unreached"
                    outcome.error = "stopped before this call (abort requested)"
                    break
                record = await _cancellable(state, cfg, job, spec, inflight)
                outcome.records.append(record)
                if record.cancelled:
                    outcome.status = "cancelled"
                    outcome.error = f"{spec['operation']}: {record.error}"
                    break
                if not record.ok:
                    outcome.status = "failed"
                    outcome.error = f"{spec['operation']}: {record.error}"
                    break
            outcome.duration_ms = (time.perf_counter() - t0) * 1000.0
            outcome.finished_at = datetime.now(UTC)
            emit(outcome)

    await asyncio.gather(*(run(job) for job in jobs))


async def _cancellable(
    state: _RunState, cfg: CallSettings, job: WorkerJob, spec: dict[str, Any], inflight: InFlight
) -> CallRecord:
    """One call that `inflight` can cancel; a cancelled call comes back as a record saying so
    (and how far it got) instead of raising.

    The call runs in its worker's own task (each worker's calls run in sequence in one task of
    the step's `gather`), registered for the length of the call: a task per call cost a task
    and a wait per call, at thousands of calls a step, for the same cancellation. A
    cancellation is the abort's when `inflight.cancelled` is set; any other (the step torn
    down) goes on up."""
    progress: list[CallProgress] = []
    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    task = asyncio.current_task()
    assert task is not None
    # Registered in the same turn of the loop in which the caller looked at `stop`: an
    # abort's cancel (scheduled on this loop after `stop` was set) always finds it.
    inflight.add(task)
    try:
        return await _run_one(state, cfg, job, spec, progress)
    except asyncio.CancelledError:
        if not inflight.cancelled:
            raise  # the step itself is being torn down: the call goes with it
        task.uncancel()
    finally:
        inflight.discard(task)
    reached = bool(progress and progress[0].sent)
    if spec["operation"] == GENERATION:
        method, url, body = "POST", cfg.frontend_url.rstrip("/") + "/v1/completions", spec["body"]
    else:
        prepared, body = state.templates.get(spec)
        method, url = prepared.call.method, admin_url(job.system_url, prepared.call)
    return CallRecord(
        operation=spec["operation"],
        method=method,
        url=url,
        request_body=body,
        http_status=None,
        response_body=None,
        ok=False,
        error=cancelled_error(progress[0] if progress else CallProgress()),
        duration_ms=(time.perf_counter() - t0) * 1000.0,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        cancelled=True,
        reached=reached,
    )
