"""Quarantine: pause one drifted worker at once, catch it up alone, admit it back.

The sequence, for one worker, while its gate stays open for the others:

1. pause — through its family's pause route (vLLM Python: requests queue while paused; a
   sidecar's pause leaves the routing set). Mode `abort`: whatever it is generating comes
   from the wrong policy, so it is dropped rather than finished. A worker that cannot be
   paused closes its gate, naming it.
2. update to the gate's `verified_policy`, then flush where the family needs it;
3. verify while still paused: version readback (must be the gate's version) and liveness;
4. resume — only now, so it never serves before its readback says V;
5. generation check pinned to it (`nvext.backend_instance_id`), cross-checked against one other
   verified worker of the gate when one is live (same prompt, pinned there, compared by the
   source's agreement rule); with no other verified worker, the generation check alone. A
   failure here pauses it again before the quarantine fails;
6. admit: back into the gate's verified set, if the gate is still at that version.

Every call goes through the executor's call machinery (`executor/calls.run_jobs`, hence the
source's outbound policy) and is journaled as a `QuarantineCall`; every move is audited.
A quarantine that fails stays paused with its reason. Its exits (`retry`, `release`, `drop`)
are operator actions below. `release` resumes the worker without admitting it, and is refused
while its version readback is not the gate's verified version: a released worker serves
unpinned traffic, so it must at least hold the right weights. `drop` is for a worker that has
left the fleet (discovery also drops those by itself).

Nobody is left waiting on a dead runner: a catch-up touches `heartbeat_at` while it runs (a
thread, so a long update call keeps it fresh); one whose heartbeat falls silent for
`QUARANTINE_STALL_SECONDS` — or a queued one nobody picked up in that time — is queued again by
the reconciler beat (`requeue_stalled`). Each claim bumps `attempts`, which fences the old
runner: its heartbeat stops matching, its remaining calls are skipped, and it writes nothing.

One owner at a time (`executor/handover.py`): a catch-up is claimed only while no policy
refresh holds its namespace, a refresh does not start while a catch-up runs there, and a
refresh that planned the worker ends its quarantine as `superseded`. A claim aims the catch-up
at the gate's verified policy of that moment: a refresh may have moved it since the drift was
found, and catching up to the older policy would undo that refresh on this worker.

Lock order: the gate row (level 4), then quarantine rows, then the audit chain head.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from controlplane import jobs, lockorder
from controlplane.accounts.roles import Perm
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.dynamo.generation import completion_sample, run_generation_check
from controlplane.dynamo.http import make_client
from controlplane.fleet.models import Worker, WorkerState
from controlplane.notify.emit import notify
from controlplane.notify.models import NotificationEvent
from controlplane.refresh import gates
from controlplane.refresh.errors import state_refusal
from controlplane.refresh.executor.calls import CallRecord, CallSettings, WorkerJob, run_jobs
from controlplane.refresh.executor.runner import call_settings
from controlplane.refresh.models import (
    HELD_QUARANTINE_STATES,
    Gate,
    PauseMode,
    Quarantine,
    QuarantineCall,
    QuarantineState,
    ScopeLock,
)
from controlplane.refresh.planning import (
    GENERATION,
    agreement_rule_of,
    generation_check_from_call,
    normalize_verification,
    plan_worker,
    source_policy,
)
from controlplane.refresh.step_order import StepName
from controlplane.textlimits import STATE_REASON_CHARS, URL_CHARS

CATCH_UP = Actor.system("quarantine catch-up")
RECONCILER = Actor.system("quarantine reconciler")
AGREEMENT = "agreement"

logger = logging.getLogger(__name__)


class QuarantineRefused(ValidationError):
    """An exit that is not possible in the quarantine's current state (changes nothing)."""


def wrong_state(q: Quarantine, *, why: str) -> QuarantineRefused:
    """An exit refused for the quarantine's state, worded as a refresh's is
    (`quarantine #3 is admitted; only an open one is dropped`)."""
    return QuarantineRefused(state_refusal(f"quarantine #{q.pk}", q.state, why=why))


#: The Celery task that runs `catch_up` (refresh/tasks.py).
CATCH_UP_TASK = "refresh.catch_up_quarantine"


# -- calls ---------------------------------------------------------------------------------------


def _settings(source) -> CallSettings:
    return call_settings(source)


def _run(job: WorkerJob, cfg: CallSettings, stop: threading.Event | None = None):
    outcomes: list[Any] = []
    asyncio.run(run_jobs([job], cfg, emit=outcomes.append, stop=stop or threading.Event()))
    return outcomes[0]


def _journal(q: Quarantine, step: str, records: list[CallRecord]) -> None:
    QuarantineCall.objects.bulk_create(
        QuarantineCall(
            quarantine=q,
            step=step,
            attempt=max(q.attempts, 1),
            operation=r.operation,
            method=r.method,
            url=r.url[:URL_CHARS],
            request_body=r.request_body,
            http_status=r.http_status,
            response_body=r.response_body,
            ok=r.ok,
            error=r.error,
            duration_ms=r.duration_ms,
            started_at=r.started_at,
            finished_at=r.finished_at,
        )
        for r in records
    )


class Plan:
    """The worker's calls for each step, built by the refresh planner for the gate's policy."""

    def __init__(self, q: Quarantine, worker: Worker, stop: threading.Event | None = None) -> None:
        source = q.source
        #: Set when this runner lost the quarantine: calls not yet made are skipped.
        self.stop = stop
        verification = normalize_verification({"agreement": agreement_rule_of(source).to_dict()})
        self.verification = verification
        self.version = (q.target or {}).get("weight_version")
        self.cfg = _settings(source)
        self.worker = worker
        self.policy = source_policy(source)
        if self.policy is None or not q.target:
            self.plan = None
            self.blockers = ["the source's allowed networks are invalid or no verified policy"]
            return
        self.plan = plan_worker(
            worker,
            target=q.target,
            pause_mode=PauseMode.ABORT,
            flush_policy="auto",
            verification=verification,
            policy=self.policy,
        )
        self.blockers = list(self.plan.blockers)

    def calls(self, step: str) -> list[dict[str, Any]]:
        return [] if self.plan is None else list(self.plan.calls.get(step, []))

    def run(self, q: Quarantine, step: str, calls: list[dict[str, Any]], **job: Any):
        if not calls:
            return None
        assert self.plan is not None  # calls exist only for a planned worker
        outcome = _run(
            WorkerJob(0, q.key, self.worker.system_url, self.plan.family, calls, **job),
            self.cfg,
            self.stop,
        )
        _journal(q, step, outcome.records)
        return outcome


# -- state moves ---------------------------------------------------------------------------------


def _move(
    q: Quarantine,
    state: str,
    action: AuditAction | None,
    reason: str,
    *,
    gate_write: Callable[[int], bool] | None = None,
    **fields,
) -> bool:
    """Save the quarantine's new state with its gate's side of it, audited, in one transaction.

    Lock order: the gate row first (`refresh.drift` locks gate, then quarantines), then this
    row, then `gate_write(gate_id)` (which may audit), then this move's audit row. When
    `gate_write` answers False nothing is written and False is returned.
    """
    actor = fields.pop("actor", None) or CATCH_UP
    now = timezone.now()
    with transaction.atomic():
        gate = _gate_of(q)
        if gate is not None:
            gates.locked_gate(gate.pk)
            if state not in (QuarantineState.ADMITTED, QuarantineState.DROPPED):
                gates.set_drift_state(gate.pk, q.instance_id, state)
        q.state, q.reason, q.updated_at = state, reason[:STATE_REASON_CHARS], now
        for name, value in fields.items():
            setattr(q, name, value)
        if state in (QuarantineState.ADMITTED, QuarantineState.DROPPED):
            q.finished_at = now
        lockorder.domain_lock("quarantines")
        q.save()
        if gate_write is not None and (gate is None or not gate_write(gate.pk)):
            transaction.set_rollback(True)
            q.refresh_from_db()
            return False
        if action is not None:
            record(
                action,
                actor=actor,
                target=q,
                details={"key": q.key, "state": state, "reason": q.reason},
                correlation_id=q.correlation_id,
            )
        event = _NOTIFIED.get(state)
        if event is not None:
            notify(event, quarantine=q)
    return True


#: The quarantine moves people hear about (besides `drift.quarantined`, sent by `refresh.drift`).
_NOTIFIED: dict[str, str] = {
    QuarantineState.ADMITTED: NotificationEvent.DRIFT_ADMITTED,
    QuarantineState.FAILED: NotificationEvent.DRIFT_FAILED,
}


def _gate_of(q: Quarantine) -> Gate | None:
    return Gate.objects.filter(source_id=q.source_id, namespace=q.namespace).first()


def _current_worker(q: Quarantine) -> Worker | None:
    return (
        Worker.objects.select_related("static_worker")
        .filter(source_id=q.source_id, namespace=q.namespace, instance_id=q.instance_id)
        .exclude(state=WorkerState.GONE)
        .first()
    )


def pause(q: Quarantine) -> bool:
    """Stop the drifted worker generating, for the runner that claimed it. A worker that cannot
    be paused closes its gate (the quarantine fails); one that left is dropped."""
    worker = _current_worker(q)
    if worker is None:
        _drop(q, CATCH_UP, "left the fleet before it was paused")
        return False
    plan = Plan(q, worker)
    pause_calls = plan.calls(StepName.PAUSE)
    if not pause_calls:
        problem = "; ".join(plan.blockers) or "no pause route"
        return _cannot_pause(q, f"cannot be paused: {problem}")
    outcome = plan.run(q, StepName.PAUSE, pause_calls)
    if outcome.status != "ok":
        return _cannot_pause(q, f"pause failed: {outcome.error}")
    # Paused by the runner that claimed it: the state stays `catching_up` (this attempt's).
    lockorder.domain_lock("quarantines")
    Quarantine.objects.filter(pk=q.pk, attempts=q.attempts).update(
        paused=True, reason="paused; catching up", updated_at=timezone.now()
    )
    q.paused = True
    return True


def _cannot_pause(q: Quarantine, reason: str) -> bool:
    def close(gate_id: int) -> bool:
        gates.close_for_drift(gate_id, actor=CATCH_UP, reason=f"drifted worker {q.key} {reason}")
        return True

    if not _move(
        q, QuarantineState.FAILED, AuditAction.QUARANTINE_FAILED, reason, gate_write=close
    ):
        _move(q, QuarantineState.FAILED, AuditAction.QUARANTINE_FAILED, reason)
    return False


def claim(q: Quarantine) -> bool:
    """Take the quarantine for a catch-up attempt (one at a time, by conditional UPDATE).

    Bumping `attempts` is the fencing token: a runner whose attempt is no longer the row's
    has been taken over (`Heartbeat`). A `catching_up` row is only taken back through
    `requeue_stalled` or `retry`, which first prove its runner went silent.

    Refused (False, the row says why) while a policy refresh holds the namespace: the refresh
    owns its workers until it ends, and the reconciler queues this catch-up again once the row
    has waited `QUARANTINE_STALL_SECONDS`. The gate row is locked first, which orders the claim
    against a refresh's start (it locks the same rows after taking its scope locks).
    """
    states = [QuarantineState.QUARANTINED, QuarantineState.FAILED]
    now = timezone.now()
    with transaction.atomic():
        gate = _gate_of(q)
        if gate is not None:
            gate = gates.locked_gate(gate.pk)
        holder = (
            ScopeLock.objects.filter(source_id=q.source_id, namespace=q.namespace)
            .values_list("refresh_id", flat=True)
            .first()
        )
        lockorder.domain_lock("quarantines")
        if holder is not None:
            reason = f"waiting: policy refresh #{holder} holds {q.namespace}"
            Quarantine.objects.filter(pk=q.pk, state__in=states, attempts=q.attempts).update(
                reason=reason[:STATE_REASON_CHARS], updated_at=now
            )
            q.refresh_from_db()
            return False
        target = q.target
        if gate is not None and gate.verified_policy and gate.verified_policy != q.target:
            target = gate.verified_policy  # a refresh moved the gate since the drift was found
        claimed = Quarantine.objects.filter(pk=q.pk, state__in=states, attempts=q.attempts).update(
            state=QuarantineState.CATCHING_UP,
            attempts=q.attempts + 1,
            updated_at=now,
            heartbeat_at=now,
            reason="catching up",
            target=target,
        )
    if claimed:
        q.refresh_from_db()
    return bool(claimed)


def running_catch_up(source, namespaces: list[str]) -> Quarantine | None:
    """A catch-up running in these namespaces, if any (a refresh's start refuses meanwhile).

    The caller holds the namespaces' gate rows locked, as `claim` does."""
    return (
        Quarantine.objects.filter(
            source=source, namespace__in=namespaces, state=QuarantineState.CATCHING_UP
        )
        .order_by("pk")
        .first()
    )


def stall_cutoff():
    return timezone.now() - timedelta(seconds=settings.QUARANTINE_STALL_SECONDS)


def stalled() -> Q:
    """Quarantines whose owner went silent for `QUARANTINE_STALL_SECONDS`: a catch-up with no
    heartbeat (its Celery worker died), or a queued one nobody picked up (its task was lost)."""
    cutoff = stall_cutoff()
    silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, updated_at__lt=cutoff)
    return (Q(state=QuarantineState.CATCHING_UP) & silent) | Q(
        state=QuarantineState.QUARANTINED, updated_at__lt=cutoff
    )


def requeue_stalled(q: Quarantine, *, actor: Actor = RECONCILER) -> bool:
    """Hand a silent quarantine back to the catch-up queue, audited; False if it is not silent
    (any more). The caller enqueues the catch-up after commit."""
    now = timezone.now()
    with transaction.atomic():
        lockorder.domain_lock("quarantines")
        before = (
            Quarantine.objects.select_for_update(no_key=True, of=("self",))
            .filter(stalled(), pk=q.pk)
            .first()
        )
        if before is None:
            return False
        last = before.heartbeat_at or before.updated_at
        if before.state == QuarantineState.CATCHING_UP:
            silent = f"its catch-up went silent (last heartbeat {last:%Y-%m-%d %H:%M:%S})"
        else:
            silent = f"its queued catch-up was never picked up (since {last:%Y-%m-%d %H:%M:%S})"
        reason = f"{silent}; queued again"
        Quarantine.objects.filter(pk=q.pk).update(
            state=QuarantineState.QUARANTINED, reason=reason, updated_at=now
        )
        record(
            AuditAction.QUARANTINE_REQUEUED,
            actor=actor,
            target=before,
            details={"key": before.key, "previous_state": before.state, "attempt": before.attempts},
            correlation_id=before.correlation_id,
        )
    q.refresh_from_db()
    return True


class Heartbeat:
    """Touch `heartbeat_at` every third of the stall time while this runner owns the catch-up.

    The touch is a conditional UPDATE on (state `catching_up`, our attempt): when it matches
    nothing the quarantine was taken over or moved on, `lost` is set, and the runner's
    remaining calls are skipped (it is the `stop` of the call runner).
    """

    def __init__(self, quarantine_id: int, attempt: int) -> None:
        self.quarantine_id = quarantine_id
        self.attempt = attempt
        self.lost = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"quarantine-{quarantine_id}")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def touch(self) -> bool:
        return bool(
            Quarantine.objects.filter(
                pk=self.quarantine_id,
                state=QuarantineState.CATCHING_UP,
                attempts=self.attempt,
            ).update(heartbeat_at=timezone.now())
        )

    def _beat(self) -> None:
        interval = settings.QUARANTINE_STALL_SECONDS / 3
        try:
            while not self._done.wait(interval):
                if not self.touch():
                    self.lost.set()
                    return
        except Exception:  # a database hiccup: the next tick tries again; stall is the backstop
            logger.exception("quarantine #%s: heartbeat failed", self.quarantine_id)
        finally:
            close_old_connections()
            connection.close()


def catch_up(quarantine_id: int) -> str:
    """Pause (if not yet), update, verify, resume and admit one quarantined worker."""
    q = Quarantine.objects.select_related("source").get(pk=quarantine_id)
    if q.state not in HELD_QUARANTINE_STATES:
        return q.state
    if not claim(q):
        return q.state
    attempt = q.attempts
    record(
        AuditAction.QUARANTINE_CATCH_UP_STARTED,
        actor=CATCH_UP,
        target=q,
        details={"key": q.key, "attempt": q.attempts, "target": q.target},
        correlation_id=q.correlation_id,
    )
    gate = _gate_of(q)
    if gate is not None:
        gates.set_drift_state(gate.pk, q.instance_id, QuarantineState.CATCHING_UP)
    with Heartbeat(q.pk, attempt) as heartbeat:
        try:
            if not q.paused and not pause(q):
                problem = "moved"  # dropped (it left) or failed (it cannot be paused)
            else:
                problem = _catch_up_steps(q, heartbeat.lost)
        except Exception as exc:  # never leave it `catching_up` without an owner
            problem = f"catch-up error: {type(exc).__name__}: {exc}"
    q.refresh_from_db()
    if problem in ("left", "moved"):
        return q.state
    if q.state != QuarantineState.CATCHING_UP or q.attempts != attempt:
        # Taken over (re-queued after this runner looked dead) or moved on meanwhile (dropped):
        # the row is no longer ours to write.
        logger.warning("quarantine #%s: attempt %s was superseded; not writing", q.pk, attempt)
        return q.state
    if problem:
        _move(q, QuarantineState.FAILED, AuditAction.QUARANTINE_FAILED, problem)
        return q.state
    version = (q.target or {}).get("weight_version")

    def admit(gate_id: int) -> bool:
        return gates.admit_instance(
            gate_id,
            q.instance_id,
            version=version,
            actor=CATCH_UP,
            note=f"{q.key} caught up to {version!r} (quarantine #{q.pk})",
            quarantine=q,
        )

    if not _move(
        q, QuarantineState.ADMITTED, AuditAction.QUARANTINE_ADMITTED, "caught up", gate_write=admit
    ):
        _move(
            q,
            QuarantineState.FAILED,
            AuditAction.QUARANTINE_FAILED,
            f"caught up to {version!r}, but the gate is no longer at that version",
        )
    return q.state


def _catch_up_steps(q: Quarantine, stop: threading.Event | None = None) -> str:
    """'' when the worker is verified and resumed; otherwise why not ('left' if it left)."""
    worker = _current_worker(q)
    if worker is None:
        _drop(q, CATCH_UP, "left the fleet during catch-up")
        return "left"
    plan = Plan(q, worker, stop)
    if plan.blockers:
        return "cannot catch up: " + "; ".join(plan.blockers)
    for step in (StepName.UPDATE, StepName.FLUSH):
        outcome = plan.run(q, step, plan.calls(step))
        if outcome is not None and outcome.status != "ok":
            return f"{step}: {outcome.error}"
    verify = plan.calls(StepName.VERIFY)
    paused_checks = [c for c in verify if c["operation"] != GENERATION]
    generation = [c for c in verify if c["operation"] == GENERATION]
    outcome = plan.run(q, StepName.VERIFY, paused_checks, expect_version=plan.version)
    if outcome is not None and outcome.status != "ok":
        return f"verify: {outcome.error}"
    outcome = plan.run(q, StepName.RESUME_ENGINES, plan.calls(StepName.RESUME_ENGINES))
    if outcome is not None and outcome.status != "ok":
        return f"resume: {outcome.error}"
    Quarantine.objects.filter(pk=q.pk).update(paused=False, updated_at=timezone.now())
    if generation:
        outcome = plan.run(q, StepName.VERIFY, generation)
        problem = "" if outcome.status == "ok" else f"generation check: {outcome.error}"
        if not problem:
            problem = _cross_check(q, plan, generation[0], outcome.records[-1])
        if problem:
            repause = plan.run(q, StepName.PAUSE, plan.calls(StepName.PAUSE))
            paused = repause is not None and repause.status == "ok"
            Quarantine.objects.filter(pk=q.pk).update(paused=paused)
            if not paused:
                gate = _gate_of(q)
                if gate is not None:
                    gates.close_for_drift(
                        gate.pk,
                        actor=CATCH_UP,
                        reason=f"drifted worker {q.key} failed its check and could not be "
                        f"paused again",
                    )
            return problem
    return ""


def _cross_check(q: Quarantine, plan: Plan, spec: dict[str, Any], own: CallRecord) -> str:
    """Compare its completion with one other verified worker of the gate, pinned there."""
    gate = _gate_of(q)
    ours = completion_sample(q.key, own.response_body)
    if gate is None or ours is None:
        return ""
    reference = (
        Worker.objects.filter(
            source_id=q.source_id,
            namespace=q.namespace,
            state=WorkerState.LIVE,
            instance_id__in=[i for i in gate.verified_instances if i != q.instance_id],
            model=plan.worker.model,
        )
        .order_by("instance_id")
        .first()
    )
    if reference is None:
        return ""  # no other verified worker: the generation check alone decides
    check = generation_check_from_call(spec)
    pinned = type(check)(
        model=check.model,
        prompt_token_ids=check.prompt_token_ids,
        max_tokens=check.max_tokens,
        backend_instance_id=int(reference.instance_id),
        expected_model=check.expected_model,
    )

    async def ask():
        async with make_client(timeout=plan.cfg.timeout) as client:
            return await run_generation_check(
                client, plan.cfg.policy, plan.cfg.frontend_url, pinned, timeout=plan.cfg.timeout
            )

    started = timezone.now()
    verdict = asyncio.run(ask())
    theirs = completion_sample(reference.key, verdict.body) if verdict.ok else None
    rule = agreement_rule_of(q.source)
    if theirs is None:
        # The reference could not answer: say so, and let the generation check alone decide.
        error, ok = f"reference {reference.key} did not answer: {verdict.reason}", True
    else:
        difference = rule.compare(theirs, ours)
        ok = difference is None
        error = "" if ok else f"disagrees with verified {reference.key}: {difference}"
    _journal(
        q,
        StepName.VERIFY,
        [
            CallRecord(
                operation=AGREEMENT,
                method="POST",
                url=plan.cfg.frontend_url.rstrip("/") + "/v1/completions",
                request_body=pinned.request_body(),
                http_status=verdict.http_status,
                response_body=verdict.body,
                ok=ok,
                error=error,
                duration_ms=(timezone.now() - started).total_seconds() * 1000.0,
                started_at=started,
                finished_at=timezone.now(),
            )
        ],
    )
    return "" if ok else f"agreement: {error}"


# -- operator exits ------------------------------------------------------------------------------


def _require(actor: Actor, perm: Perm) -> None:
    if actor.user is not None and not actor.user.has_perm(perm.value):
        raise PermissionDenied(f"{actor.label} may not {perm.codename.replace('_', ' ')}")


def retry(q: Quarantine, *, actor: Actor) -> Quarantine:
    """Run the catch-up again (a failed one, or one whose task died)."""
    _require(actor, Perm.OPERATE_REFRESH)
    stale = Quarantine.objects.filter(stalled(), pk=q.pk).exists()
    if q.state not in (QuarantineState.FAILED, QuarantineState.QUARANTINED) and not stale:
        raise wrong_state(q, why="only a failed, queued or stalled one is retried")
    if _current_worker(q) is None:
        raise QuarantineRefused(f"{q.key} has left the fleet; drop it instead")
    with transaction.atomic():
        lockorder.domain_lock("quarantines")
        Quarantine.objects.filter(pk=q.pk).update(
            state=QuarantineState.QUARANTINED, reason="retry queued", updated_at=timezone.now()
        )
        record(
            AuditAction.QUARANTINE_RETRIED,
            actor=actor,
            target=q,
            details={"key": q.key, "previous_reason": q.reason},
            correlation_id=q.correlation_id,
        )
        transaction.on_commit(lambda: enqueue_catch_up(q.pk))
    q.refresh_from_db()
    return q


def release(q: Quarantine, *, actor: Actor, reason: str) -> Quarantine:
    """Resume the worker without admitting it (it stays outside the verified set)."""
    _require(actor, Perm.OPERATE_REFRESH)
    if not reason.strip():
        raise QuarantineRefused("a release needs a reason")
    if q.state not in (QuarantineState.FAILED, QuarantineState.QUARANTINED):
        raise wrong_state(q, why="only a held one is released")
    worker = _current_worker(q)
    if worker is None:
        raise QuarantineRefused(f"{q.key} has left the fleet; drop it instead")
    plan = Plan(q, worker)
    if plan.plan is None:
        raise QuarantineRefused("; ".join(plan.blockers))
    readback = [c for c in plan.calls(StepName.VERIFY) if c["operation"] == "get_weight_version"]
    if not readback:
        raise QuarantineRefused(f"{q.key} cannot read back its version: release refused")
    outcome = plan.run(q, "release", readback, expect_version=plan.version)
    if outcome.status != "ok":
        raise QuarantineRefused(
            f"release refused: it would serve the wrong policy ({outcome.error})"
        )
    outcome = plan.run(q, "release", plan.calls(StepName.RESUME_ENGINES))
    if outcome is None or outcome.status != "ok":
        error = outcome.error if outcome else "no resume route"
        raise QuarantineRefused(f"resume failed: {error}")

    def served(gate_id: int) -> bool:
        gates.instance_released(gate_id, q.instance_id, version=plan.version, key=q.key)
        return True

    _move(
        q,
        QuarantineState.RELEASED,
        AuditAction.QUARANTINE_RELEASED,
        f"released by {actor.label}: {reason.strip()}",
        paused=False,
        actor=actor,
        gate_write=served if _gate_of(q) is not None else None,
    )
    return q


def drop(q: Quarantine, *, actor: Actor) -> Quarantine:
    """Forget a quarantined worker that has left the fleet (refused while it is still there)."""
    _require(actor, Perm.OPERATE_REFRESH)
    if not q.is_open:
        raise wrong_state(q, why="only an open one is dropped")
    if _current_worker(q) is not None:
        raise QuarantineRefused(f"{q.key} is still in the fleet; retry or release it")
    _drop(q, actor, f"dropped by {actor.label}: it left the fleet")
    return q


def _drop(q: Quarantine, actor: Actor, reason: str) -> None:
    def forget(gate_id: int) -> bool:
        gates.forget_drift(gate_id, q.instance_id)
        return True

    if not _move(
        q,
        QuarantineState.DROPPED,
        AuditAction.QUARANTINE_DROPPED,
        reason,
        actor=actor,
        gate_write=forget,
    ):
        _move(q, QuarantineState.DROPPED, AuditAction.QUARANTINE_DROPPED, reason, actor=actor)


def enqueue_catch_up(quarantine_id: int) -> None:
    # By task name: refresh/tasks.py imports this module to run the catch-up. A send the
    # broker refuses never fails the committed action: the quarantine stays queued, and the
    # reconciler requeues it once stalled (`requeue_stalled_quarantines`).
    jobs.send(CATCH_UP_TASK, quarantine_id)


# -- presentation --------------------------------------------------------------------------------


def serialize_quarantine(q: Quarantine) -> dict[str, Any]:
    """One quarantine as the API and `manage.py quarantine` show it."""
    return {
        "id": q.pk,
        "source": q.source.name,
        "namespace": q.namespace,
        "instance_id": q.instance_id,
        "key": q.key,
        "worker_id": q.worker_id,
        "kind": q.kind,
        "detail": q.detail,
        "state": q.state,
        "reason": q.reason,
        "paused": q.paused,
        "attempts": q.attempts,
        "target_version": (q.target or {}).get("weight_version"),
        "created_at": q.created_at,
        "updated_at": q.updated_at,
        "heartbeat_at": q.heartbeat_at,
        "finished_at": q.finished_at,
    }


def serialize_journal(q: Quarantine, limit: int = 1000) -> list[dict[str, Any]]:
    return [
        {
            "id": c.pk,
            "step": c.step,
            "attempt": c.attempt,
            "operation": c.operation,
            "method": c.method,
            "url": c.url,
            "http_status": c.http_status,
            "ok": c.ok,
            "error": c.error,
            "duration_ms": c.duration_ms,
            "started_at": c.started_at,
            "finished_at": c.finished_at,
        }
        for c in q.journal.order_by("id")[:limit]
    ]
