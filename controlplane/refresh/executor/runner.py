"""The executor: claim the lease, run steps in order from the refresh's state, end cleanly.

Where to start is read from the database (the state names the step, the worker results say
which workers are done), so a fresh start, a retry and a takeover after a crash are the same
loop. Any failure holds the refresh: gate closed, reason recorded, lease released.

Except a transient database failure (a terminated backend, a failover): the journal's fenced
transactions retry on their own (`journal.StepJournal.flush`, which writes the record of calls
already made rather than making them again), and anything else that meets one runs the loop
again from the database's state after reconnecting, with backoff (`controlplane.dbretry`).
Only when `REFRESH_DB_OUTAGE_SECONDS` pass without a step ending does the refresh hold, with a
reason naming the database.

Every transaction the executor opens is durable (`atomic(durable=True)`): steps call workers
between them, so none may be folded into a caller's outer transaction that would hold the
refresh's locks (and hide its journal) across that network I/O.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, cast

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet, prefetch_related_objects
from django.utils import timezone

from controlplane import dbretry, telemetry
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import record
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.notify.emit import notify
from controlplane.refresh import gates
from controlplane.refresh.departed import DEPARTED, departed_keys
from controlplane.refresh.executor import budget, waves
from controlplane.refresh.executor.abort import confirm_abort
from controlplane.refresh.executor.calls import CallRuntime, CallSettings
from controlplane.refresh.executor.canary import CanaryRollback
from controlplane.refresh.executor.journal import JournalOutage
from controlplane.refresh.executor.lease import AbortPending, Lease, LeaseLost
from controlplane.refresh.executor.step_base import StepContext, StepResult
from controlplane.refresh.executor.steps import EXECUTOR, STEPS
from controlplane.refresh.executor.tracing import refresh_trace, step_span
from controlplane.refresh.live import publish_state, publish_step
from controlplane.refresh.models import (
    EXECUTING_STATES,
    WAITING_STATES,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
    StepRun,
    WorkerStepResult,
    state_change,
)
from controlplane.refresh.namespaces import resolved_of
from controlplane.refresh.planning import source_policy
from controlplane.refresh.progress import with_canary_failed
from controlplane.refresh.step_order import (
    STATE_STEP,
    STEP_STATE,
    WORKER_STEPS,
    StepName,
    next_step,
)
from controlplane.textlimits import STATE_REASON_CHARS

#: Every step the executor runs: the sequence's, and the rollback of a failed canary.
ALL_STEPS = {**STEPS, StepName.CANARY_ROLLBACK: CanaryRollback()}

logger = logging.getLogger(__name__)


def call_settings(source) -> CallSettings:
    return CallSettings(
        # Invalid allowlist → empty policy → every call refused: fail closed.
        policy=source_policy(source) or OutboundPolicy(()),
        frontend_url=source.frontend_url,
        timeout=settings.REFRESH_CALL_TIMEOUT_SECONDS,
        concurrency=settings.REFRESH_CONCURRENCY,
        release=source.dynamo_release or "",
    )


class Runner:
    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.takeover_pending = lease.takeover
        self._cfg: CallSettings | None = None
        self._resources = contextlib.ExitStack()
        self._planned: QuerySet[PlannedWorker] | None = None
        #: Consecutive transient database failures since a step last ended.
        self._outage = dbretry.Outage()
        #: The step run in progress, and why it stopped when a database failure interrupted it.
        self._step_run: StepRun | None = None
        self._interrupted = ""
        self._recovery_recorded = False
        #: A step's failure the runner has not acted on yet (see `_hold_unjudged`).
        self._unjudged: tuple[StepName, StepRun, StepResult] | None = None

    def load(self) -> PolicyRefresh:
        return PolicyRefresh.objects.select_related("source").get(pk=self.lease.refresh_id)

    def call_settings(self, refresh: PolicyRefresh) -> CallSettings:
        """The run's call settings, with one event loop and HTTP client for all its steps
        (started with the first step that runs, closed when `run` returns). The source's
        allowlist, frontend and timeouts are read once: a change applies from the next run."""
        if self._cfg is None:
            cfg = call_settings(refresh.source)
            runtime = self._resources.enter_context(
                CallRuntime(cfg.policy, timeout=cfg.timeout, concurrency=cfg.concurrency)
            )
            self._cfg = dataclasses.replace(cfg, policy=runtime.policy, runtime=runtime)
        return self._cfg

    def with_planned_workers(self, refresh: PolicyRefresh) -> PolicyRefresh:
        """`refresh` with its planned workers (`refresh.workers.all()`) read once per run.

        The plan writes them before the refresh starts and nothing changes them while it
        executes (a person's changes — leave out, resolve membership — happen while it is held,
        and the next run reads them again), so every step of one run shares one read, given
        as Django's prefetch cache: `workers.all()` serves it, a filtered query still asks the
        database. Decoding each worker's planned calls per step was the largest cost of a
        refresh of a large fleet after the journal."""
        if self._planned is None:
            prefetch_related_objects([refresh], "workers")
            self._planned = cast(Any, refresh)._prefetched_objects_cache["workers"]
        else:
            cast(Any, refresh)._prefetched_objects_cache = {"workers": self._planned}
        return refresh

    def run(self, *, stop_after: str | None = None) -> str:
        with self._resources:
            return self._run(stop_after)

    def _run(self, stop_after: str | None) -> str:
        while True:
            try:
                return self._loop(stop_after)
            except LeaseLost:
                logger.warning("policy refresh #%s: lease lost, stopping", self.lease.refresh_id)
                return "lease_lost"
            except AbortPending:
                # A person aborted while this executor moved the refresh on: the move did not
                # apply; the loop reads `aborting` and confirms the abort.
                self._unjudged = None
                continue
            except dbretry.DatabaseOutage as outage:
                return self._hold_after_outage(outage)
            except Exception as exc:
                if dbretry.is_transient(exc) and not dbretry.in_transaction():
                    try:
                        # Reconnects and waits, or raises once the bound has passed.
                        self._outage.failed(exc, "running the refresh")
                    except dbretry.DatabaseOutage as outage:
                        return self._hold_after_outage(outage)
                    if self._step_run is not None:
                        self._interrupted = f"{type(exc).__name__}: {str(exc).strip()}"
                    continue
                logger.exception("policy refresh #%s: executor error", self.lease.refresh_id)
                try:
                    return self._hold_after_error(exc)
                except LeaseLost:
                    return "lease_lost"

    def _hold_unjudged(self) -> str:
        """A step failed and a database failure came before the runner acted on it: hold with
        the step's reason rather than run it again (which would call the failing workers once
        more without a person deciding to)."""
        assert self._unjudged is not None
        step, step_run, result = self._unjudged
        self._interrupted = ""
        refresh = self.load()
        if refresh.state == RefreshState.ABORTING:
            self._unjudged = None
            self._finish_step_run(step_run, "failed", result.reason)
            return ""  # the loop confirms the abort
        at_step = (
            refresh.state in EXECUTING_STATES and STATE_STEP[RefreshState(refresh.state)] == step
        )
        if at_step and refresh.abort_requested:
            self._finish_step_run(step_run, "failed", "aborted")
            self._confirm_abort(refresh)  # as the person asked; the loop goes on from there
        elif at_step:
            self._hold_failed_step(refresh, step, result.reason, step_run)
        self._unjudged = None
        return RefreshState.HELD if at_step and not refresh.abort_requested else ""

    def _close_interrupted_step_run(self) -> None:
        """A database failure cut the last step run short: it ends failed, saying so, and the
        loop runs the step again (as a new attempt) from the database's state."""
        step_run = self._step_run
        if step_run is None or not self._interrupted:
            return
        with transaction.atomic(durable=True):
            self.lease.guard()
            self._finish_step_run(
                step_run,
                "failed",
                f"interrupted by a database error ({self._interrupted}); run again",
            )
        self._interrupted = ""

    def _loop(self, stop_after: str | None) -> str:
        if self._unjudged is not None and (held := self._hold_unjudged()):
            return held
        self._close_interrupted_step_run()
        if self.takeover_pending and not self._recovery_recorded:
            refresh = self.load()
            with transaction.atomic(durable=True):
                self.lease.guard()
                record(
                    AuditAction.POLICY_REFRESH_RECOVERED,
                    actor=EXECUTOR,
                    target=refresh,
                    details={"state": refresh.state, "fencing_token": self.lease.token},
                    correlation_id=refresh.correlation_id,
                )
            self._recovery_recorded = True
        #: The refresh as read right after the last step ended (and published): nothing happens
        #: between that read and the next turn of the loop, so it is not read a second time.
        ended: PolicyRefresh | None = None
        while True:
            refresh = ended if ended is not None else self.load()
            ended = None
            if refresh.state not in EXECUTING_STATES:
                with transaction.atomic(durable=True):
                    self.lease.release()
                return refresh.state
            if refresh.state == RefreshState.ABORTING or (
                refresh.abort_requested and refresh.state != RefreshState.RELEASING
            ):
                if self._confirm_abort(refresh) == RefreshState.ABORTED:
                    return RefreshState.ABORTED
                continue
            step = STATE_STEP[RefreshState(refresh.state)]
            result, step_run, ctx = self._run_step(refresh, step)
            self._outage.clear()
            self.takeover_pending = False
            if result.waiting:
                # The step gave the lease up with its move to a waiting state: record it, stop.
                with transaction.atomic(durable=True):
                    self._finish_step_run(step_run, "ok", result.detail)
                return self._published().state
            if not result.ok:
                self._unjudged = (step, step_run, result)
            refresh = self.load()
            if refresh.state == RefreshState.ABORTING or (
                refresh.abort_requested and (result.aborted or not result.ok)
            ):
                # Aborted: whatever the step did (done, failed, its calls cancelled), the
                # person's abort decides what follows.
                self._unjudged = None
                stopped = result.reason if result.aborted else ""
                if result.aborted:
                    asked = refresh.end_reason or "aborted"
                    self._finish_step_run(step_run, "aborted", f"{asked}: {stopped}")
                elif result.ok:
                    self._finish_step_run(step_run, "ok", result.detail)
                else:
                    self._finish_step_run(step_run, "failed", result.reason)
                if self._confirm_abort(refresh, stopped) == RefreshState.ABORTED:
                    return RefreshState.ABORTED
                continue
            if not result.ok:
                outcome = self._after_failure(refresh, step, step_run, result, ctx)
                self._unjudged = None
                if outcome:
                    return outcome
                continue
            refresh = self._advance(refresh, step, step_run, result)
            self._outage.clear()
            if stop_after == step:
                # Test seam: behave like an executor that died here (lease left to expire).
                return "stopped"
            if refresh.state in (
                RefreshState.SUCCEEDED,
                RefreshState.ABORTED,
                RefreshState.FAILED,
                RefreshState.HELD,
                *WAITING_STATES,
            ):
                return refresh.state
            ended = refresh

    def _after_failure(
        self, refresh, step: StepName, step_run: StepRun, result: StepResult, ctx: StepContext
    ) -> str:
        """A step failed: the failure budget may leave the failing workers out (the step runs
        again for the rest: returns ""), a failed canary is rolled back (""), or it holds."""
        absorbed, note = budget.absorb(ctx, step)
        if absorbed:
            self._finish_step_run(step_run, "failed", f"{result.reason} — {note}")
            return ""
        reason = f"{result.reason} ({note})" if note else result.reason
        if step in WORKER_STEPS and waves.is_canary_wave(refresh):
            self._roll_back_canary(
                refresh, step, step_run, f"canary failed at {step.value}: {reason}"
            )
            return ""
        self._hold_failed_step(refresh, step, reason, step_run)
        return RefreshState.HELD

    def _hold_failed_step(self, refresh, step: StepName, reason: str, step_run: StepRun) -> None:
        """Hold after a failed step, retried on its own through a transient database failure:
        left to the loop, the step would run again — calling the failing workers once more
        without a person deciding to."""

        first = True

        def hold() -> None:
            nonlocal first
            current = refresh if first else self.load()
            first = False
            if current.state in EXECUTING_STATES:  # else the hold's commit landed
                self._hold(current, step, reason, step_run)

        dbretry.retry(hold, what="holding the refresh after a failed step")

    def _roll_back_canary(self, refresh, step: StepName, step_run: StepRun, reason: str) -> None:
        with transaction.atomic(durable=True):
            self.lease.guard(
                **state_change(
                    RefreshState.CANARY_ROLLBACK,
                    held_reason=reason[:STATE_REASON_CHARS],
                    progress=with_canary_failed(refresh, reason, EXECUTOR.label),
                )
            )
            self._finish_step_run(step_run, "failed", reason)
            record(
                AuditAction.POLICY_REFRESH_CANARY_FAILED,
                actor=EXECUTOR,
                target=refresh,
                details={"step": step.value, "reason": reason},
                correlation_id=refresh.correlation_id,
            )
        publish_state(self.load())

    def _run_step(
        self, refresh: PolicyRefresh, step: StepName
    ) -> tuple[StepResult, StepRun, StepContext]:
        # Attempts count per wave: wave 2's first pause is a first attempt, not a retry.
        attempt = StepRun.objects.filter(refresh=refresh, name=step, wave=refresh.wave).count() + 1
        with transaction.atomic(durable=True):
            self.lease.guard()
            step_run = StepRun.objects.create(
                refresh=refresh,
                name=step,
                attempt=attempt,
                wave=refresh.wave,
                started_at=timezone.now(),
            )
            transaction.on_commit(lambda: setattr(self, "_step_run", step_run))
            record(
                AuditAction.POLICY_REFRESH_STEP_STARTED,
                actor=EXECUTOR,
                target=refresh,
                details={"step": step.value, "attempt": attempt, "wave": refresh.wave},
                correlation_id=refresh.correlation_id,
            )
        publish_step(refresh.pk, step.value, "running")
        ctx = StepContext(
            refresh=self.with_planned_workers(refresh),
            lease=self.lease,
            cfg=self.call_settings(refresh),
            attempt=attempt,
            takeover=self.takeover_pending,
        )
        with step_span(step.value, attempt) as span:
            result = ALL_STEPS[step].run(ctx)
            if not result.ok:
                telemetry.mark_failed(span, result.reason)
        return result, step_run, ctx

    def _published(self) -> PolicyRefresh:
        """The refresh read after a change of state, published to its pages."""
        refresh = self.load()
        publish_state(refresh)
        return refresh

    def _finish_step_run(self, step_run: StepRun, status: str, detail: str) -> None:
        transaction.on_commit(lambda: self._step_run_ended(step_run))
        now = timezone.now()
        StepRun.objects.filter(pk=step_run.pk).update(
            status=status,
            detail=detail[:STATE_REASON_CHARS],
            finished_at=now,
            duration_ms=(now - step_run.started_at).total_seconds() * 1000.0,
        )
        publish_step(step_run.refresh_id, step_run.name, status, detail)

    def _step_run_ended(self, step_run: StepRun) -> None:
        if self._step_run is not None and self._step_run.pk == step_run.pk:
            self._step_run = None

    def _advance(
        self, refresh, step: StepName, step_run: StepRun, result: StepResult
    ) -> PolicyRefresh:
        """Move on after a successful step; returns the refresh as read (and published) after
        the move."""
        if step == StepName.RELEASE:
            return self._end_after_release(refresh, step_run, result)
        if step == StepName.CANARY_ROLLBACK:
            # Rolled back: hold with the canary's failure (there is no failed step to retry).
            reason = f"{refresh.held_reason}; {result.detail}"
            return self._hold(refresh, step, reason, step_run, failed_step="")
        if step == StepName.VERIFY and refresh.wave < refresh.waves:
            return self._next_wave(refresh, step_run, result)
        following = next_step(step)
        with transaction.atomic(durable=True):
            if following is None:
                self.lease.release(**state_change(RefreshState.SUCCEEDED))
            else:
                self.lease.guard(**state_change(STEP_STATE[following]))
            self._finish_step_run(step_run, "ok", result.detail)
            if following is None:
                # Lock order: scope locks and gates before the audit chain head.
                gates.release_scope(refresh, "")
            record(
                AuditAction.POLICY_REFRESH_STEP_SUCCEEDED,
                actor=EXECUTOR,
                target=refresh,
                details={"step": step.value, "detail": result.detail},
                correlation_id=refresh.correlation_id,
            )
            if following is None:
                record(
                    AuditAction.POLICY_REFRESH_SUCCEEDED,
                    actor=EXECUTOR,
                    target=refresh,
                    details={"weight_version": refresh.weight_version},
                    correlation_id=refresh.correlation_id,
                )
                notify("refresh.succeeded", refresh=refresh)
        return self._published()

    def _next_wave(self, refresh, step_run: StepRun, result: StepResult) -> PolicyRefresh:
        """A wave (not the last) verified: the next wave, a canary verdict or a pause point."""
        with transaction.atomic(durable=True):
            self.lease.guard()
            self._finish_step_run(step_run, "ok", result.detail)
            waves.finish_wave(self.lease, refresh, EXECUTOR)
        return self._published()

    def _hold(
        self,
        refresh,
        step: StepName,
        reason: str,
        step_run: StepRun | None,
        *,
        failed_step: str | None = None,
    ) -> PolicyRefresh:
        failing = list(
            WorkerStepResult.objects.filter(refresh=refresh, step=step)
            .exclude(status__in=("ok", "skipped"))
            .values_list("planned_worker__key", "error")[:50]
        )
        with transaction.atomic(durable=True):
            self.lease.release(
                **state_change(
                    RefreshState.HELD,
                    failed_step=step.value if failed_step is None else failed_step,
                    held_reason=reason[:STATE_REASON_CHARS],
                    abort_requested=False,
                    # A failed release keeps its end state, so a retry still ends the same way.
                    end_state=refresh.end_state if step == StepName.RELEASE else "",
                )
            )
            if step_run is not None:
                self._finish_step_run(step_run, "failed", reason)
            # Lock order: gates before the audit chain head.
            gates.update_gate_reason(refresh, f"policy refresh #{refresh.pk} held: {reason}")
            record(
                AuditAction.POLICY_REFRESH_STEP_FAILED,
                actor=EXECUTOR,
                target=refresh,
                details={"step": step.value, "reason": reason, "failing_workers": failing},
                correlation_id=refresh.correlation_id,
            )
            record(
                AuditAction.POLICY_REFRESH_HELD,
                actor=EXECUTOR,
                target=refresh,
                details={"step": step.value, "reason": reason},
                correlation_id=refresh.correlation_id,
            )
            notify("refresh.held", refresh=refresh, reason=reason)
        return self._published()

    def _confirm_abort(self, refresh: PolicyRefresh, stopped: str = "") -> str:
        """The abort's calls are cancelled: end `aborted`, or release first (`abort.py`)."""
        step_run = self._step_run
        if step_run is not None:
            # The step stopped without being recorded (a database failure cut it short, or the
            # abort refused the state change it was writing): it ends aborted.
            with transaction.atomic(durable=True):
                self.lease.guard()
                self._finish_step_run(step_run, "aborted", refresh.end_reason or "aborted")
        self._interrupted = ""

        def confirm() -> str:
            current = self.load()
            if current.state != RefreshState.ABORTING and not (
                current.abort_requested
                and current.state in EXECUTING_STATES
                and current.state != RefreshState.RELEASING
            ):
                return current.state  # a retried confirmation whose commit had landed
            return confirm_abort(self.lease, current, stopped=stopped)

        state = dbretry.retry(confirm, what="confirming the abort")
        self._published()
        return state

    def _end_after_release(self, refresh, step_run: StepRun, result: StepResult) -> PolicyRefresh:
        """End as the person chose, even where a listed worker could not be resumed.

        Holding again would hand the decision back to the same failing worker (and used to
        keep the scope locked for ever), so the refresh ends, frees its scope and says which
        engines may still be paused and why: in its end reason, the release step (failed) and
        the audit event. The gate stays as the person left it (closed after an abort, open
        after a force-reopen); the next refresh of the scope pauses and resumes them anyway.
        """
        if refresh.end_state == RefreshState.HELD:
            return self._back_to_held(refresh, step_run, result)
        end_state = refresh.end_state or RefreshState.ABORTED
        unresumed = list(
            WorkerStepResult.objects.filter(
                refresh=refresh, step=StepName.RELEASE, attempt=step_run.attempt
            )
            .exclude(status__in=("ok", "skipped", DEPARTED))
            .values_list("planned_worker__key", "error")
        )
        departed = sorted(departed_keys(refresh.pk))
        end_reason = refresh.end_reason
        if unresumed:
            named = "; ".join(f"{key}: {error}" for key, error in unresumed[:5])
            end_reason += (
                f" — {len(unresumed)} engine{'' if len(unresumed) == 1 else 's'} could not be "
                f"resumed and may still be paused ({named})"
            )
        if departed:
            end_reason += f" — {len(departed)} worker(s) had left the fleet"
        with transaction.atomic(durable=True):
            self.lease.release(
                **state_change(end_state, end_reason=end_reason[:STATE_REASON_CHARS])
            )
            self._finish_step_run(step_run, "failed" if unresumed else "ok", result.detail)
            gates.release_scope(refresh, f"policy refresh #{refresh.pk} {end_state}: {end_reason}")
            action = (
                AuditAction.POLICY_REFRESH_ABORTED
                if end_state == RefreshState.ABORTED
                else AuditAction.POLICY_REFRESH_FAILED
            )
            record(
                action,
                actor=EXECUTOR,
                target=refresh,
                details={
                    "reason": end_reason,
                    "engines_resumed": not unresumed,
                    "not_resumed": [{"worker": k, "error": e} for k, e in unresumed],
                    "left_the_fleet": departed,
                },
                correlation_id=refresh.correlation_id,
            )
        return self._published()

    def _back_to_held(self, refresh, step_run: StepRun, result: StepResult) -> PolicyRefresh:
        """A namespace was closed out on its own and its engines resumed: the refresh is held
        again for the namespaces left, at the step it was held at, with its reason."""
        unresumed = list(
            WorkerStepResult.objects.filter(
                refresh=refresh, step=StepName.RELEASE, attempt=step_run.attempt
            )
            .exclude(status__in=("ok", "skipped", DEPARTED))
            .values_list("planned_worker__key", "error")
        )
        with transaction.atomic(durable=True):
            self.lease.release(
                **state_change(
                    RefreshState.HELD, end_state="", end_reason="", abort_requested=False
                )
            )
            self._finish_step_run(step_run, "failed" if unresumed else "ok", result.detail)
            record(
                AuditAction.POLICY_REFRESH_HELD,
                actor=EXECUTOR,
                target=refresh,
                details={
                    "step": refresh.failed_step,
                    "reason": refresh.held_reason,
                    "released": result.detail,
                    "not_resumed": [{"worker": k, "error": e} for k, e in unresumed],
                    "resolved_namespaces": sorted(resolved_of(refresh)),
                },
                correlation_id=refresh.correlation_id,
            )
        return self._published()

    def _hold_after_error(self, exc: Exception) -> str:
        """An unexpected executor error holds the refresh instead of crashing it in a loop.

        Left executing, the reconciler would re-run it after every lease period and hit the same
        error for ever; held, a person sees the error and can retry, roll back or end it.
        """
        refresh = self.load()
        if refresh.state not in EXECUTING_STATES:
            return refresh.state
        if refresh.state == RefreshState.ABORTING:
            # The person's abort stands: end as they asked rather than hold.
            return self._confirm_abort(refresh)
        step = STATE_STEP[RefreshState(refresh.state)]
        self._hold(refresh, step, f"executor error: {type(exc).__name__}: {exc}", None)
        return RefreshState.HELD

    def _hold_after_outage(self, outage: dbretry.DatabaseOutage) -> str:
        """The database stayed unreachable past the bound: hold, with the outage as the reason,
        as soon as it answers again — after writing the journal of calls made meanwhile.

        It keeps trying for as long as the lease would last (at least another bound): until
        then nobody else may take the refresh. If the database still does not answer, the lease
        is left to expire and the reconciler resumes the refresh later, as after a crash (see
        `steps.Update`)."""
        logger.error("policy refresh #%s: %s", self.lease.refresh_id, outage)
        step_run = self._step_run

        def hold() -> str:
            if isinstance(outage, JournalOutage):
                outage.write_unwritten()
            refresh = self.load()
            if refresh.state not in EXECUTING_STATES:
                return refresh.state
            if refresh.state == RefreshState.ABORTING:
                return confirm_abort(self.lease, refresh)
            step = STATE_STEP[RefreshState(refresh.state)]
            self._hold(refresh, step, str(outage), step_run)
            return RefreshState.HELD

        try:
            return dbretry.retry(
                hold,
                what="holding the refresh after a database outage",
                outage=dbretry.Outage(max(outage.bound, self.lease.seconds)),
            )
        except LeaseLost:
            return "lease_lost"
        except dbretry.DatabaseOutage:
            logger.exception("policy refresh #%s: could not hold", self.lease.refresh_id)
            return "database_unreachable"


def execute_refresh(
    refresh_id: int, *, owner: str | None = None, stop_after: str | None = None
) -> str:
    """Run a refresh from wherever its state says, if nobody else holds a live lease."""
    lease = Lease.claim(refresh_id, owner)
    if lease is None:
        return "not_claimed"
    with refresh_trace(refresh_id):
        return Runner(lease).run(stop_after=stop_after)
