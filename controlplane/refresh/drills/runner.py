"""The drill's orchestration: forward refresh → its end → back refresh → its end.

`advance` is idempotent and reads everything from the database (the drill row and its two
refreshes), so whoever calls it — the Celery task's poll chain, the reconciler after a worker
died, a test in-process — carries on from where the drill stands. Each direction is a refresh
restricted to the drill's `instances` (`intents.plan_policy_refresh`): the executor runs it as
always, and the refresh's own reconciler recovers it if its executor dies. The refresh id is
recorded on the drill before the refresh starts, so a crash never plans a direction twice.

Only one caller advances a drill at a time: `claim` is a conditional UPDATE of
`claimed_until`. The task re-queues itself every `DRILL_POLL_SECONDS` while a refresh runs,
touching `updated_at`; a running drill whose `updated_at` is older than `DRILL_STALL_SECONDS`
lost its chain, and `resume_stalled_drills` (beat) queues it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Min, Q
from django.utils import timezone

from controlplane import jobs, lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor, record
from controlplane.fleet.models import Source, Worker, WorkerState
from controlplane.refresh import intents
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.models import (
    OPEN_QUARANTINE_STATES,
    TERMINAL_STATES,
    DrillOutcome,
    DrillPhase,
    DrillRun,
    Gate,
    PolicyRefresh,
    Quarantine,
    RefreshState,
    ScopeLock,
)
from controlplane.refresh.quarantine import CATCH_UP_TASK
from controlplane.textlimits import STATE_REASON_CHARS

logger = logging.getLogger(__name__)

RUNNER = Actor.system("rollback drill")
SCHEDULE = Actor.system("rollback drill schedule")
#: Each direction runs all at once over its few instances: a source's default canary or
#: waves would make a drill wait for verdicts meant for real policy changes.
DRILL_STRATEGY = {"kind": "all_at_once"}

Execute = Callable[[int], object]


# -- claiming -------------------------------------------------------------------------------------


def claim(drill_id: int) -> bool:
    now = timezone.now()
    until = now + timedelta(seconds=settings.DRILL_CLAIM_SECONDS)
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    return bool(
        DrillRun.objects.filter(free, pk=drill_id, outcome=DrillOutcome.RUNNING).update(
            claimed_until=until, updated_at=now
        )
    )


def unclaim(drill_id: int) -> None:
    DrillRun.objects.filter(pk=drill_id).update(claimed_until=None, updated_at=timezone.now())


#: The drill task, sent by name (`controlplane.jobs`).
RUN_DRILL_TASK = "refresh.run_drill"


def enqueue_drill(drill_id: int, countdown: float = 0) -> None:
    # A refused send loses nothing: `refresh.drill_tick` queues a running drill again once it
    # has been silent for DRILL_STALL_SECONDS.
    jobs.send(RUN_DRILL_TASK, drill_id, countdown=countdown or None)


# -- advancing ------------------------------------------------------------------------------------


def _actor(drill: DrillRun) -> Actor:
    return Actor.for_user(drill.requested_by) if drill.requested_by else RUNNER


def _seconds(refresh: PolicyRefresh) -> float:
    """From the refresh's first step to its end: the time the direction took, without any
    wait for approval before it."""
    first = refresh.steps.aggregate(first=Min("started_at"))["first"] or refresh.started_at
    end = refresh.finished_at or timezone.now()
    return round((end - first).total_seconds(), 3) if first else 0.0


def _direction(forward: bool) -> str:
    return "forward" if forward else "back"


def _plan(drill: DrillRun, forward: bool) -> PolicyRefresh | str:
    """Plan this direction's refresh and record it on the drill; or why it could not be."""
    target = drill.previous_policy if forward else drill.current_policy
    try:
        refresh = intents.plan_policy_refresh(
            source=drill.source,
            actor=_actor(drill),
            target=target,
            namespaces=drill.namespaces,
            instances=drill.instances,
            strategy=DRILL_STRATEGY,
        )
    except ValidationError as exc:
        return f"the {_direction(forward)} refresh could not be planned: {'; '.join(exc.messages)}"
    field = "forward_refresh" if forward else "back_refresh"
    DrillRun.objects.filter(pk=drill.pk, **{f"{field}__isnull": True}).update(
        **{field: refresh, "updated_at": timezone.now()}
    )
    return refresh


def _start(drill: DrillRun, refresh: PolicyRefresh, forward: bool, execute: Execute | None) -> str:
    """Start a planned direction (and run it here when `execute` is given); or why not."""
    what = f"the {_direction(forward)} refresh (policy refresh #{refresh.pk})"
    if refresh.plan_blockers:
        intents.discard_policy_refresh(refresh, actor=RUNNER, reason="rollback drill plan blocked")
        return f"{what} is blocked: {'; '.join(refresh.plan_blockers)}"
    try:
        intents.start_policy_refresh(refresh, actor=_actor(drill), enqueue=execute is None)
    except RefreshError as exc:
        intents.discard_policy_refresh(refresh, actor=RUNNER, reason="rollback drill refused")
        return f"{what} could not start: {exc.message}"
    if execute is not None:
        execute(refresh.pk)
    return ""


def advance(drill_id: int, *, execute: Execute | None = None) -> bool:
    """Move the drill as far as it goes now; True once it has ended. `execute` runs a started
    refresh in this thread (tests, `manage.py drill --wait` without workers); by default the
    refresh is enqueued and the caller polls again later."""
    while True:
        drill = DrillRun.objects.select_related(
            "source", "requested_by", "forward_refresh", "back_refresh"
        ).get(pk=drill_id)
        if not drill.is_running:
            return True
        forward = drill.phase == DrillPhase.FORWARD
        refresh = drill.forward_refresh if forward else drill.back_refresh
        if refresh is None:
            planned = _plan(drill, forward)
            if isinstance(planned, str):
                fail(drill, planned)
                return True
            refresh = planned
        if refresh.state == RefreshState.PLANNED:
            problem = _start(drill, refresh, forward, execute)
            if problem:
                fail(drill, problem)
                return True
            continue
        if refresh.state == RefreshState.SUCCEEDED:
            seconds = _seconds(refresh)
            if forward:
                DrillRun.objects.filter(pk=drill.pk).update(
                    forward_seconds=seconds, phase=DrillPhase.BACK, updated_at=timezone.now()
                )
                continue
            succeed(drill, seconds)
            return True
        if refresh.state in TERMINAL_STATES or refresh.state == RefreshState.HELD:
            reason = refresh.held_reason or refresh.end_reason or refresh.state
            fail(
                drill,
                f"the {_direction(forward)} refresh (policy refresh #{refresh.pk}) ended "
                f"{refresh.state}: {reason}",
                refresh=refresh,
            )
            return True
        return False


def succeed(drill: DrillRun, back_seconds: float) -> None:
    with transaction.atomic():
        DrillRun.objects.filter(pk=drill.pk, outcome=DrillOutcome.RUNNING).update(
            outcome=DrillOutcome.SUCCEEDED,
            phase=DrillPhase.DONE,
            back_seconds=back_seconds,
            finished_at=timezone.now(),
            updated_at=timezone.now(),
            claimed_until=None,
        )
        drill.refresh_from_db()
        record(
            AuditAction.DRILL_SUCCEEDED,
            actor=RUNNER,
            target=drill,
            details={
                "drill_id": drill.pk,
                "forward_refresh_id": drill.forward_refresh_id,
                "back_refresh_id": drill.back_refresh_id,
                "forward_seconds": drill.forward_seconds,
                "back_seconds": drill.back_seconds,
            },
            correlation_id=drill.correlation_id,
        )


# -- failing safely -------------------------------------------------------------------------------


def _away(drill: DrillRun) -> dict[str, list[Worker]]:
    """Drilled workers still live but outside their gate's verified set, per namespace."""
    verified = {
        ns: set(ids)
        for ns, ids in Gate.objects.filter(
            source=drill.source, namespace__in=drill.namespaces
        ).values_list("namespace", "verified_instances")
    }
    away: dict[str, list[Worker]] = {}
    for worker in Worker.objects.filter(
        source=drill.source,
        namespace__in=drill.namespaces,
        instance_id__in=drill.instances,
        state=WorkerState.LIVE,
    ):
        if worker.instance_id not in verified.get(worker.namespace, set()):
            away.setdefault(worker.namespace, []).append(worker)
    return away


def _quarantine(drill: DrillRun, away: dict[str, list[Worker]]) -> list[int]:
    """Hand drilled workers nobody owns to quarantine: paused, caught up to the gate's verified
    policy alone and admitted back (README "Drift and quarantine"), each with its exits."""
    opened: list[Quarantine] = []
    with transaction.atomic():
        lockorder.domain_lock("quarantines")
        owned = set(
            Quarantine.objects.filter(
                source=drill.source, state__in=OPEN_QUARANTINE_STATES
            ).values_list("instance_id", flat=True)
        )
        gates = {g.namespace: g for g in Gate.objects.filter(source=drill.source)}
        for namespace, workers in sorted(away.items()):
            gate = gates.get(namespace)
            if gate is None or not gate.verified_policy:
                continue
            for worker in workers:
                if worker.instance_id in owned:
                    continue
                opened.append(
                    Quarantine.objects.create(
                        source=drill.source,
                        namespace=namespace,
                        instance_id=worker.instance_id,
                        key=worker.key,
                        worker=worker,
                        kind="drill",
                        detail=f"left outside the verified set by failed rollback drill "
                        f"#{drill.pk}",
                        target=gate.verified_policy,
                        reason="pause queued",
                    )
                )
        for q in opened:
            record(
                AuditAction.QUARANTINE_STARTED,
                actor=RUNNER,
                target=q,
                details={"key": q.key, "kind": q.kind, "detail": q.detail, "drill_id": drill.pk},
                correlation_id=q.correlation_id,
            )
    ids = [q.pk for q in opened]
    for pk in ids:
        jobs.enqueue(CATCH_UP_TASK, pk)
    return ids


def _next_step(drill: DrillRun, refresh: PolicyRefresh | None) -> str:
    """What a person does about the subset after a failure (and, where nobody owns it, the
    quarantines opened for it)."""
    current = drill.current_version
    locked = ScopeLock.objects.filter(source=drill.source, namespace__in=drill.namespaces)
    if refresh is not None and refresh.state == RefreshState.HELD:
        if drill.phase == DrillPhase.FORWARD:
            return (
                f"policy refresh #{refresh.pk} is held with the subset outside the verified set: "
                f"retry it to finish the drill's forward step, or roll it back (returns the "
                f"subset to {current!r}); then start a new drill"
            )
        return (
            f"policy refresh #{refresh.pk} is held with the subset still on "
            f"{drill.previous_version!r} and outside the verified set: retry it to bring the "
            f"subset back to {current!r}; ending it instead leaves the subset to the source's "
            "drift policy"
        )
    other = locked.select_related("refresh").first()
    if other is not None:
        return (
            f"policy refresh #{other.refresh_id} ({other.refresh.state}) holds the scope and "
            "owns the subset now; when it ends, drift reconciliation checks every worker"
        )
    away = _away(drill)
    if not away:
        return "every drilled worker is back in the verified set; nothing to do"
    opened = _quarantine(drill, away)
    if not opened:
        return (
            "the drilled workers outside the verified set are already quarantined; see the "
            "source's workers"
        )
    return (
        f"the subset was quarantined (quarantine{'s' if len(opened) > 1 else ''} "
        f"{', '.join(f'#{pk}' for pk in opened)}): each is paused, caught up to {current!r} "
        "alone and admitted back; retry, release or drop it from its worker's page"
    )


def fail(drill: DrillRun, reason: str, *, refresh: PolicyRefresh | None = None) -> None:
    """End the drill failed with `reason`, and leave the subset out of the gate with an exit."""
    next_step = _next_step(drill, refresh)
    with transaction.atomic():
        changed = DrillRun.objects.filter(pk=drill.pk, outcome=DrillOutcome.RUNNING).update(
            outcome=DrillOutcome.FAILED,
            reason=reason[:STATE_REASON_CHARS],
            next_step=next_step[:STATE_REASON_CHARS],
            finished_at=timezone.now(),
            updated_at=timezone.now(),
            claimed_until=None,
        )
        if not changed:
            return
        drill.refresh_from_db()
        record(
            AuditAction.DRILL_FAILED,
            actor=RUNNER,
            target=drill,
            details={
                "drill_id": drill.pk,
                "phase": drill.phase,
                "reason": drill.reason,
                "next_step": drill.next_step,
                "forward_refresh_id": drill.forward_refresh_id,
                "back_refresh_id": drill.back_refresh_id,
                "forward_seconds": drill.forward_seconds,
            },
            correlation_id=drill.correlation_id,
        )


# -- beat -----------------------------------------------------------------------------------------


def resume_stalled_drills(*, resume: Callable[[int], object]) -> list[int]:
    """Queue again every running drill whose poll chain went silent (its worker died)."""
    cutoff = timezone.now() - timedelta(seconds=settings.DRILL_STALL_SECONDS)
    stalled = list(
        DrillRun.objects.filter(outcome=DrillOutcome.RUNNING, updated_at__lt=cutoff)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=timezone.now()))
        .values_list("pk", flat=True)
    )
    for pk in stalled:
        DrillRun.objects.filter(pk=pk).update(updated_at=timezone.now())
        record(
            AuditAction.DRILL_RESUMED,
            actor=RUNNER,
            target=("refresh.drillrun", pk),
            details={"drill_id": pk, "why": "its task went silent"},
            correlation_id=f"drill-{pk}",
        )
        resume(pk)
    return stalled


def due_sources(now=None) -> list[Source]:
    """Sources whose drill schedule is due: `drill_every` hours since their last drill began."""
    now = now or timezone.now()
    due = []
    for source in Source.objects.filter(drill_every__gt=0, enabled=True, stale=False):
        last = source.drills.order_by("-started_at").values_list("started_at", flat=True).first()
        if last is None or now - last >= timedelta(hours=source.drill_every):
            due.append(source)
    return due


def record_skipped(source: Source, message: str) -> None:
    """A due drill the schedule skipped this tick: logged every tick, audited once for each
    reason in a row (a scope held for a day must not write an audit row every tick)."""
    logger.info("drill schedule: %s skipped: %s", source.name, message)
    skips = AuditEvent.objects.filter(
        action=AuditAction.DRILL_SKIPPED,
        target_type=source._meta.label_lower,
        target_id=str(source.pk),
    )
    last_drill = source.drills.order_by("-started_at").values_list("started_at", flat=True).first()
    if last_drill is not None:
        skips = skips.filter(occurred_at__gt=last_drill)
    last = skips.order_by("-sequence").values_list("details", flat=True).first()
    if last is not None and last.get("reason") == message:
        return
    record(
        AuditAction.DRILL_SKIPPED,
        actor=SCHEDULE,
        target=source,
        details={"source": source.name, "reason": message, "scheduled": True},
    )


def record_refused(source: Source, message: str) -> DrillRun:
    """A scheduled drill that could not begin, as a failed drill with the reason."""
    now = timezone.now()
    with transaction.atomic():
        drill = DrillRun.objects.create(
            source=source,
            current_policy={},
            previous_policy={},
            scheduled=True,
            requested_by_label=SCHEDULE.label,
            phase=DrillPhase.FORWARD,
            outcome=DrillOutcome.FAILED,
            reason=f"the scheduled drill could not start: {message}",
            next_step="nothing was touched; the schedule tries again after its interval",
            finished_at=now,
        )
        record(
            AuditAction.DRILL_FAILED,
            actor=SCHEDULE,
            target=drill,
            details={"drill_id": drill.pk, "reason": drill.reason, "scheduled": True},
            correlation_id=drill.correlation_id,
        )
    return drill
