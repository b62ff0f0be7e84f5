"""Operator intents on policy refreshes and gates: one function each.

Each writes its change and its audit rows in one transaction and enqueues the executor with
`transaction.on_commit`. Views, the JSON API, webhooks and the management command call these;
they never write refresh models themselves.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from controlplane import jobs, lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet import discovery
from controlplane.fleet.models import DiscoveryRun, DiscoveryTrigger, Source, Worker, WorkerState
from controlplane.notify.emit import notify
from controlplane.refresh import abort_signal, gates
from controlplane.refresh.compat import compat_at_plan, normalize_versions
from controlplane.refresh.drills.hold import held_by_drill_message, holding_drill, serialize_scope
from controlplane.refresh.errors import (
    ApprovalNotAllowed,
    InvalidTransition,
    PlanBlocked,
    RefreshConflict,
)
from controlplane.refresh.executor.departures import DEPARTED, LEFT_THE_FLEET, write_departures
from controlplane.refresh.executor.steps import verified_instance_sets
from controlplane.refresh.live import publish_state
from controlplane.refresh.models import (
    EXECUTING_STATES,
    WAITING_STATES,
    FlushPolicy,
    Gate,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
)
from controlplane.refresh.namespaces import (
    FORCE_REOPENED,
    REOPENED,
    release_namespace_locks,
    verified_namespaces,
)
from controlplane.refresh.planning import (
    agreement_rule_of,
    group_plan,
    normalize_fingerprint,
    normalize_pause_modes,
    normalize_target,
    normalize_verification,
    plan_level_blockers,
    plan_worker,
    source_policy,
)
from controlplane.refresh.sequence import STEP_STATE, StepName
from controlplane.refresh.strategy import (
    Placed,
    assign_waves,
    instance_list,
    parse_strategy,
    rollback_strategy,
    stored,
)

#: By name (controlplane/jobs.py): this module stays free of the tasks module.
EXECUTE_TASK = "refresh.execute_policy_refresh"


def _enqueue(refresh_id: int) -> None:
    # Robust: the change is committed; a send the broker refuses is logged, and the reconciler
    # resends a started refresh nobody claimed (refresh/reconcile.py `orphaned_refresh_ids`).
    jobs.enqueue(EXECUTE_TASK, refresh_id)


def _audit(action: AuditAction, refresh: PolicyRefresh, actor: Actor, **details: Any) -> None:
    record(
        action,
        actor=actor,
        target=refresh,
        details={"refresh_id": refresh.pk, **details},
        correlation_id=refresh.correlation_id,
    )


def _live_workers(source: Source, namespaces: list[str] | None):
    workers = Worker.objects.filter(source=source).exclude(state=WorkerState.GONE)
    if namespaces:
        workers = workers.filter(namespace__in=namespaces)
    return workers.select_related("static_worker")


def _membership(workers) -> list[str]:
    return sorted(w.key for w in workers if w.static_worker_id is None)


#: How long a plan waits for a scheduled discovery refresh that holds the source.
PLAN_DISCOVERY_WAIT_SECONDS = 15.0


def _fresh_discovery(source: Source) -> tuple[DiscoveryRun | None, str]:
    """A fresh discovery refresh through the fleet app: (run, problem).

    Fresh means observed after this plan was asked for. When another refresh holds the source,
    a run of it that started after we asked serves this plan too, so a burst of plans on one
    source (concurrent webhooks or API calls) shares a few discoveries instead of queueing
    behind each other until the wait runs out.
    """
    asked_at = timezone.now()
    deadline = time.monotonic() + PLAN_DISCOVERY_WAIT_SECONDS
    while True:
        run = discovery.refresh_source(source.pk, trigger=DiscoveryTrigger.PLAN, wait=0.2)
        if run is None:
            run = (
                DiscoveryRun.objects.filter(
                    source=source, started_at__gte=asked_at, finished_at__isnull=False
                )
                .order_by("-started_at")
                .first()
            )
        if run is not None or time.monotonic() >= deadline:
            break
    if run is None:
        return None, "no fresh discovery: the source is disabled or another refresh holds it"
    if not run.ok:
        return run, f"discovery failed: {run.error or 'listener unreachable'}"
    return run, ""


def plan_policy_refresh(
    *,
    source: Source,
    actor: Actor,
    target: dict[str, Any],
    namespaces: list[str] | None = None,
    worker_ids: list[int] | None = None,
    pause_mode: str = "auto",
    verification: dict[str, Any] | None = None,
    rollback_of: PolicyRefresh | None = None,
    flush_policy: str = "auto",
    fingerprint: dict[str, Any] | None = None,
    pause_modes: dict[str, str] | None = None,
    versions: dict[str, str] | None = None,
    strategy: dict[str, Any] | None = None,
    instances: list[str] | None = None,
) -> PolicyRefresh:
    """Run a fresh discovery and store the plan; blockers are stored, never raised.

    `fingerprint` is the trainer's optional statement of what the new policy generates
    (`dynamo.fingerprint.Fingerprint`); bad input raises ValidationError before anything runs.
    `strategy` is the JSON form of a `refresh.strategy.Strategy` (None: the source's default
    strategy). `instances` refreshes only those instance ids of the scope: the others keep
    serving and stay in the gate's verified set (the refresh runs staged, the gate is not
    closed; see `executor.waves.finish_instances`).
    """
    parsed = parse_strategy(source.default_strategy if strategy is None else strategy)
    instance_ids = instance_list(instances)
    target = normalize_target(target)
    verification = normalize_verification(verification)
    verification["agreement"] = agreement_rule_of(source).to_dict()
    fingerprint = normalize_fingerprint(fingerprint)
    if fingerprint and not verification["generation"]:
        raise ValidationError("a fingerprint needs the generation check, which is turned off")
    pause_modes = normalize_pause_modes(pause_mode, pause_modes)
    try:
        versions = normalize_versions(versions)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None
    if flush_policy not in FlushPolicy.values:
        raise ValidationError(f"unknown flush policy {flush_policy!r}")
    namespaces = sorted(set(namespaces)) if namespaces else None

    last_view = set(_membership(_live_workers(source, namespaces)))
    run, problem = _fresh_discovery(source)  # network I/O: outside any transaction
    blockers: list[str] = [problem] if problem else []

    workers = list(_live_workers(source, namespaces))
    membership = _membership(workers)
    if namespaces is None:
        namespaces = sorted({w.namespace for w in workers})
    if last_view and set(membership) != last_view:
        joined, left = set(membership) - last_view, last_view - set(membership)
        blockers.append(
            f"membership differs from the last view ({len(joined)} joined, {len(left)} left); "
            "review the fleet and plan again"
        )
    selected = workers
    subset_keys = None
    if worker_ids:
        selected = [w for w in workers if w.pk in set(worker_ids)]
        subset_keys = sorted(w.key for w in selected)
        if len(selected) != len(set(worker_ids)):
            blockers.append("some selected workers are gone or outside the chosen namespaces")
    if instance_ids is not None:
        by_instance = {w.instance_id: w for w in selected}
        missing = [i for i in instance_ids if i not in by_instance]
        if missing:
            blockers.append(
                f"instance(s) {', '.join(missing)} are not live workers of the chosen scope"
            )
        selected = [by_instance[i] for i in instance_ids if i in by_instance]
    if not selected:
        blockers.append("no live workers in the chosen scope")
    staged = parsed.staged or instance_ids is not None
    if staged and target["method"] == "distributed":
        blockers.append(
            "a distributed update forms one collective group of every worker: it cannot run "
            "in waves, as a canary or on named instances; plan it all at once"
        )
    wave_of, wave_count, wave_blockers = assign_waves(
        parsed, [Placed(w.key, w.namespace, w.instance_id) for w in selected]
    )
    blockers += wave_blockers

    policy = source_policy(source)
    blockers += plan_level_blockers(source, verification=verification, policy=policy)
    group = group_plan(target, selected)
    blockers += group.pop("blockers", [])
    ranks = group.get("ranks", {})
    plans = [
        plan_worker(
            w,
            target=target,
            pause_mode=pause_mode,
            pause_modes=pause_modes,
            flush_policy=flush_policy,
            verification=verification,
            policy=policy or OutboundPolicy(()),
            fingerprint=fingerprint,
            rank=tuple(ranks[w.key]) if w.key in ranks else None,
            group_world_size=group.get("world_size"),
        )
        for w in selected
    ]
    blocked = sum(1 for p in plans if p.blockers)
    if blocked:
        blockers.append(f"{blocked} of {len(plans)} workers have blockers")

    with transaction.atomic():
        refresh = PolicyRefresh.objects.create(
            source=source,
            namespaces=namespaces,
            worker_keys=subset_keys,
            target=target,
            pause_mode=pause_mode,
            pause_modes=pause_modes,
            flush_policy=flush_policy,
            verification=verification,
            fingerprint=fingerprint,
            group=group,
            compat=compat_at_plan(source, target, verification, plans, group, run, versions),
            plan_blockers=blockers,
            plan_membership=membership,
            discovery_run=run,
            requested_by=actor.user,
            requested_by_label=actor.label[:200],
            rollback_of=rollback_of,
            strategy=parsed.to_dict(),
            instances=instance_ids,
            waves=max(wave_count, 1),
        )
        PlannedWorker.objects.bulk_create(
            PlannedWorker(
                refresh=refresh,
                worker=p.worker,
                key=p.worker.key,
                namespace=p.worker.namespace,
                instance_id=p.worker.instance_id,
                system_url=p.worker.system_url,
                family=p.family,
                model=p.worker.model,
                calls=p.calls,
                blockers=p.blockers,
                flush_skipped=p.flush_skipped,
                update_method=p.update_method,
                method_reason=p.method_reason,
                pause_mode=p.pause_mode,
                rank_offset=p.rank_offset,
                ranks=p.ranks,
                wave=wave_of.get(p.worker.key, 1),
            )
            for p in plans
        )
        _audit(
            AuditAction.POLICY_REFRESH_PLANNED,
            refresh,
            actor,
            source=source.name,
            namespaces=namespaces,
            target=target,
            workers=len(plans),
            blockers=blockers,
            rollback_of=rollback_of.pk if rollback_of else None,
            agreement=verification["agreement"],
            fingerprint=fingerprint,
            pause_modes=pause_modes,
            world_size=group.get("world_size"),
            strategy=parsed.to_dict(),
            waves=wave_count,
            instances=instance_ids,
        )
    return refresh


def _conflict(source: Source, namespaces: list[str]) -> RefreshConflict:
    lock = (
        ScopeLock.objects.filter(source=source, namespace__in=namespaces)
        .select_related("refresh")
        .first()
    )
    if lock is None:
        return RefreshConflict("another policy refresh is starting on this scope")
    other = lock.refresh
    return RefreshConflict(
        f"policy refresh #{other.pk} ({other.state}) is active on "
        f"{source.name}/{lock.namespace}; wait for it or resolve it first",
        active_refresh_id=other.pk,
    )


def _locked(refresh: PolicyRefresh) -> PolicyRefresh:
    lockorder.domain_lock("a policy refresh row")
    return (
        PolicyRefresh.objects.select_for_update(no_key=True, of=("self",))
        .select_related("source")
        .get(pk=refresh.pk)
    )


def start_policy_refresh(
    refresh: PolicyRefresh, *, actor: Actor, enqueue: bool = True, require_approval: bool = False
) -> PolicyRefresh:
    """Take the scope (database-enforced) and run, or wait for approval where required.

    Approval is required when the source demands it or the caller asks (`require_approval`,
    e.g. a trainer webhook whose endpoint policy or metric rule says so).
    `enqueue=False` leaves execution to the caller (the management command runs in-process).
    """
    with transaction.atomic():
        refresh = _locked(refresh)
        if refresh.state != RefreshState.PLANNED:
            raise InvalidTransition(f"policy refresh #{refresh.pk} is {refresh.state}, not planned")
        if refresh.plan_blockers:
            raise PlanBlocked("the plan has blockers: " + "; ".join(refresh.plan_blockers))
        # Lock order: refresh row, then scope locks (sorted namespaces), audit chain head last.
        lockorder.domain_lock("scope locks")
        # A running drill holds its namespaces between its legs too (only its legs may start).
        serialize_scope(refresh.source_id)
        drill = holding_drill(refresh.source_id, refresh.namespaces, refresh_id=refresh.pk)
        if drill is not None:
            raise RefreshConflict(held_by_drill_message(drill, refresh.namespaces))
        try:
            with transaction.atomic():
                ScopeLock.objects.bulk_create(
                    ScopeLock(source=refresh.source, namespace=ns, refresh=refresh)
                    for ns in sorted(refresh.namespaces)
                )
        except IntegrityError:
            raise _conflict(refresh.source, refresh.namespaces) from None
        needs_approval = refresh.source.require_approval or require_approval
        refresh.transition(
            RefreshState.AWAITING_APPROVAL if needs_approval else STEP_STATE[StepName.GATE]
        )
        _audit(AuditAction.POLICY_REFRESH_REQUESTED, refresh, actor, needs_approval=needs_approval)
        if needs_approval:
            notify("refresh.awaiting_approval", refresh=refresh)
        else:
            _audit(AuditAction.POLICY_REFRESH_STARTED, refresh, actor)
            if enqueue:
                _enqueue(refresh.pk)
    transaction.on_commit(lambda: publish_state(refresh))
    return refresh


def approve_policy_refresh(
    refresh: PolicyRefresh, *, actor: Actor, enqueue: bool = True
) -> PolicyRefresh:
    with transaction.atomic():
        refresh = _locked(refresh)
        if refresh.state != RefreshState.AWAITING_APPROVAL:
            raise ApprovalNotAllowed(f"policy refresh #{refresh.pk} is not awaiting approval")
        if actor.user is None or actor.user.pk == refresh.requested_by_id:
            raise ApprovalNotAllowed("the requester cannot approve their own policy refresh")
        refresh.transition(RefreshState.GATING, approved_by=actor.user, approved_at=timezone.now())
        _audit(AuditAction.POLICY_REFRESH_APPROVED, refresh, actor)
        _audit(AuditAction.POLICY_REFRESH_STARTED, refresh, actor)
        if enqueue:
            _enqueue(refresh.pk)
    transaction.on_commit(lambda: publish_state(refresh))
    return refresh


def reject_policy_refresh(refresh: PolicyRefresh, *, actor: Actor, reason: str) -> PolicyRefresh:
    if not reason or not reason.strip():
        raise ValidationError("a rejection needs a reason")
    with transaction.atomic():
        refresh = _locked(refresh)
        if refresh.state != RefreshState.AWAITING_APPROVAL:
            raise ApprovalNotAllowed(f"policy refresh #{refresh.pk} is not awaiting approval")
        if actor.user is not None and actor.user.pk == refresh.requested_by_id:
            raise ApprovalNotAllowed("the requester cannot reject their own policy refresh")
        refresh.transition(RefreshState.REJECTED, end_reason=reason.strip())
        gates.release_scope(refresh, "")
        _audit(AuditAction.POLICY_REFRESH_REJECTED, refresh, actor, reason=reason.strip())
    transaction.on_commit(lambda: publish_state(refresh))
    return refresh


def abort_policy_refresh(
    refresh: PolicyRefresh, *, actor: Actor, resume_engines: bool = False
) -> PolicyRefresh:
    """Stop at the next call boundary. Ends held (gate closed) unless `resume_engines`."""
    reason = f"aborted by {actor.label}"
    with transaction.atomic():
        refresh = _locked(refresh)
        state = refresh.state
        if state in (RefreshState.PLANNED, RefreshState.AWAITING_APPROVAL):
            # Nothing touched yet: end at once.
            refresh.transition(RefreshState.ABORTED, end_reason=reason)
            gates.release_scope(refresh, "")
        elif state in EXECUTING_STATES and state != RefreshState.RELEASING:
            refresh.abort_requested = True
            refresh.end_reason = reason
            refresh.end_state = RefreshState.ABORTED if resume_engines else ""
            refresh.save(update_fields=["abort_requested", "end_reason", "end_state"])
            # The running step hears it through Redis, without a query per heartbeat.
            abort_signal.send_on_commit(refresh.pk)
        elif (state == RefreshState.HELD and resume_engines) or state in WAITING_STATES:
            # Waiting between waves, nothing it paused is left but the workers its failure
            # budget handed to quarantine (which stay paused): the release ends it cleanly.
            refresh.transition(
                RefreshState.RELEASING, end_state=RefreshState.ABORTED, end_reason=reason
            )
            _enqueue(refresh.pk)
        else:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is {state}; a held refresh is aborted by resuming "
                "its engines, or resolved by retry, rollback, force-reopen or ending it"
            )
        _audit(AuditAction.POLICY_REFRESH_ABORTED, refresh, actor, resume_engines=resume_engines)
    transaction.on_commit(lambda: publish_state(refresh))
    return refresh


def discard_policy_refresh(
    refresh: PolicyRefresh, *, actor: Actor, reason: str = ""
) -> PolicyRefresh:
    """Throw away a plan that was never started, so it stops waiting to be confirmed.

    Only from `planned`: nothing was locked, gated or called, so the plan simply ends. It
    ends in the terminal state `aborted` (the model has no state of its own for it; the end
    reason and the `policy_refresh.discarded` audit event say it was discarded).
    """
    with transaction.atomic():
        refresh = _locked(refresh)
        if refresh.state != RefreshState.PLANNED:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is {refresh.state}; only a planned refresh that "
                "was never started can be discarded"
            )
        reason = (reason or "").strip()
        end_reason = f"plan discarded by {actor.label}" + (f": {reason}" if reason else "")
        refresh.transition(RefreshState.ABORTED, end_reason=end_reason[:4000])
        _audit(AuditAction.POLICY_REFRESH_DISCARDED, refresh, actor, reason=reason)
    transaction.on_commit(lambda: publish_state(refresh))
    return refresh


def retry_policy_refresh(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """Re-run the failed step on failed or unreached workers only, then carry on."""
    with transaction.atomic():
        refresh = _locked(refresh)
        if refresh.state == RefreshState.HELD and not refresh.failed_step:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is held with nothing to retry ("
                f"{refresh.held_reason or 'no failed step'}); roll back the scope or end it"
            )
        if refresh.state != RefreshState.HELD or not refresh.failed_step:
            raise InvalidTransition(f"policy refresh #{refresh.pk} is {refresh.state}, not held")
        step = StepName(refresh.failed_step)
        refresh.transition(STEP_STATE[step], held_reason="", abort_requested=False)
        _audit(AuditAction.POLICY_REFRESH_RETRIED, refresh, actor, step=step.value)
        _enqueue(refresh.pk)
    transaction.on_commit(lambda: publish_state(refresh))
    return refresh


#: States an approver may end a refresh from (executing ones only once no executor is alive).
ENDABLE_STATES = (
    EXECUTING_STATES | WAITING_STATES | {RefreshState.AWAITING_APPROVAL, RefreshState.HELD}
)


def _executor_alive(refresh: PolicyRefresh) -> bool:
    # A claimed lease that has not expired: an executor is calling workers right now.
    return refresh.lease_expires_at is not None and refresh.lease_expires_at > timezone.now()


def can_end(refresh: PolicyRefresh) -> bool:
    """Whether `end_policy_refresh` would accept this refresh now (for the page's button)."""
    if refresh.state not in ENDABLE_STATES:
        return False
    return refresh.state not in EXECUTING_STATES or not _executor_alive(refresh)


def left_paused_keys(refresh: PolicyRefresh) -> list[str]:
    """Workers this refresh paused and has not resumed since (nor seen leave the fleet)."""
    paused = set(
        refresh.journal.filter(step=StepName.PAUSE).values_list("planned_worker_id", flat=True)
    )
    # The latest result per worker at resume/release decides whether it is running again.
    latest: dict[int, str] = {}
    for worker_id, status in (
        refresh.results.filter(step__in=(StepName.RESUME_ENGINES, StepName.RELEASE))
        .order_by("id")
        .values_list("planned_worker_id", "status")
    ):
        latest[worker_id] = status
    departed = set(
        refresh.results.filter(status=DEPARTED).values_list("planned_worker_id", flat=True)
    )
    left = paused - departed - {pk for pk, status in latest.items() if status == "ok"}
    return sorted(refresh.workers.filter(pk__in=left).values_list("key", flat=True))


def end_policy_refresh(refresh: PolicyRefresh, *, actor: Actor, reason: str) -> PolicyRefresh:
    """Close a refresh out on an approver's written say-so, whatever its workers do.

    The way out that never depends on a worker answering: no call is made. The refresh ends
    `aborted` with the reason, its scope is free at once and its gates stay closed (force-reopen
    is a separate, deliberate act). Workers it paused are left as they are and named in the end
    reason and the audit event, so a person can look at them; the next refresh of the scope
    pauses and resumes them anyway.

    A refresh whose executor is alive must be aborted first (it stops at the next call
    boundary and holds); one whose executor died (lease expired or never claimed) can be ended
    directly. Ending bumps the fencing token, so a stalled executor can never write again.
    """
    if not reason or not reason.strip():
        raise ValidationError("ending a policy refresh needs a written reason")
    reason = reason.strip()
    with transaction.atomic():
        refresh = _locked(refresh)
        if refresh.state not in ENDABLE_STATES:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is {refresh.state}; only an active refresh ends"
            )
        if refresh.state in EXECUTING_STATES and _executor_alive(refresh):
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is running ({refresh.state}); abort it first "
                "(it stops at the next call boundary), then end it"
            )
        left_paused = left_paused_keys(refresh)
        end_reason = f"ended by {actor.label}: {reason}"
        if left_paused:
            end_reason += (
                f" — {len(left_paused)} worker{'' if len(left_paused) == 1 else 's'} this refresh "
                f"paused left as they are ({', '.join(left_paused[:5])}"
                f"{', …' if len(left_paused) > 5 else ''})"
            )
        previous = refresh.state
        refresh.transition(
            RefreshState.ABORTED,
            end_reason=end_reason[:4000],
            end_state="",
            abort_requested=False,
            lease_token=F("lease_token") + 1,
            lease_owner="",
            lease_expires_at=None,
        )
        refresh.refresh_from_db()  # the new fencing token
        gates.release_scope(refresh, f"policy refresh #{refresh.pk} {end_reason}")
        _audit(
            AuditAction.POLICY_REFRESH_ENDED,
            refresh,
            actor,
            reason=reason,
            previous_state=previous,
            failed_step=refresh.failed_step,
            left_paused=left_paused,
            gates="unchanged: closed gates stay closed",
        )
    transaction.on_commit(lambda: publish_state(refresh))
    return refresh


def last_verified_policy(source: Source, namespaces: list[str]) -> dict[str, Any] | None:
    gate = (
        Gate.objects.filter(source=source, namespace__in=namespaces, verified_policy__isnull=False)
        .order_by("-updated_at")
        .first()
    )
    return gate.verified_policy if gate else None


#: States a rollback takes a refresh over from.
ROLLBACK_STATES = frozenset({RefreshState.HELD, *WAITING_STATES})


def rollback_policy_refresh(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """A new refresh of the same scope to its last verified policy; it inherits the scope.

    From a staged refresh (held, or waiting between waves) the policy is the one its gates
    stood for before it began (an `admit_as_verified` gate may already stand for the new one),
    and the rollback runs in waves of the same size, so rolling back does not empty the fleet.
    """
    if refresh.state not in ROLLBACK_STATES:
        raise InvalidTransition(f"policy refresh #{refresh.pk} is {refresh.state}, not held")
    policy = (refresh.progress or {}).get("previous_policy") or last_verified_policy(
        refresh.source, refresh.namespaces
    )
    if policy is None:
        raise InvalidTransition("this scope has no verified policy to roll back to")
    new = plan_policy_refresh(
        source=refresh.source,
        actor=actor,
        target=policy,
        namespaces=refresh.namespaces,
        pause_mode=refresh.pause_mode,
        pause_modes=refresh.pause_modes,
        verification=refresh.verification,
        rollback_of=refresh,
        flush_policy=refresh.flush_policy,
        strategy=rollback_strategy(stored(refresh)),
    )
    if new.plan_blockers:
        raise PlanBlocked("the rollback plan has blockers: " + "; ".join(new.plan_blockers))
    with transaction.atomic():
        old = _locked(refresh)
        if old.state not in ROLLBACK_STATES:
            raise InvalidTransition(f"policy refresh #{old.pk} is {old.state}, not held")
        new = _locked(new)
        # The rollback takes over the scope (and the paused workers) without a gap.
        ScopeLock.objects.filter(refresh=old).update(refresh=new)
        Gate.objects.filter(active_refresh=old).update(active_refresh=new)
        old.transition(
            RefreshState.ROLLED_BACK, end_reason=f"rolled back by policy refresh #{new.pk}"
        )
        needs_approval = new.source.require_approval
        new.transition(RefreshState.AWAITING_APPROVAL if needs_approval else RefreshState.GATING)
        _audit(
            AuditAction.POLICY_REFRESH_ROLLED_BACK,
            old,
            actor,
            rollback_refresh_id=new.pk,
            target=policy,
        )
        _audit(AuditAction.POLICY_REFRESH_REQUESTED, new, actor, needs_approval=needs_approval)
        if needs_approval:
            notify("refresh.awaiting_approval", refresh=new)
        else:
            _audit(AuditAction.POLICY_REFRESH_STARTED, new, actor)
            _enqueue(new.pk)

    def publish_both() -> None:
        publish_state(old)
        publish_state(new)

    transaction.on_commit(publish_both)
    return new


def _namespace_outcome(outcome: str, actor: Actor, reason: str = "") -> dict[str, str]:
    return {
        "outcome": outcome,
        "by": actor.label[:200],
        "at": timezone.now().isoformat(),
        "reason": reason,
    }


def resolved_summary(refresh: PolicyRefresh) -> str:
    """The namespaces resolved on their own, in words (for an end reason); "" when none."""
    parts = []
    for namespace, how in sorted((refresh.resolved_namespaces or {}).items()):
        text = f"{namespace} {how.get('outcome', '').replace('_', '-')} by {how.get('by', '?')}"
        if how.get("reason"):
            text += f": {how['reason']}"
        parts.append(text)
    return "; ".join(parts)


def force_reopen_gate(gate: Gate, *, actor: Actor, reason: str) -> Gate:
    """Open a closed gate on a person's written say-so, for its namespace only.

    A held refresh on the gate loses just that namespace: the executor resumes the engines it
    paused there and holds again for the other namespaces, which keep their own recoveries
    (retry, reopen all verified, force-reopen, abort). Force-reopening the last namespace still
    held closes the refresh out: its engines are resumed and it ends as failed.
    """
    if not reason or not reason.strip():
        raise ValidationError("force-reopening a gate needs a written reason")
    reason = reason.strip()
    with transaction.atomic():
        # Lock order: the refresh row before its gate (controlplane/lockorder.py).
        refresh = Gate.objects.get(pk=gate.pk).active_refresh
        if refresh is not None:
            refresh = _locked(refresh)
        gate = (
            Gate.objects.select_for_update(no_key=True, of=("self",))
            .select_related("source")
            .get(pk=gate.pk)
        )
        if gate.active_refresh_id != (refresh.pk if refresh else None):
            raise InvalidTransition("the gate changed hands meanwhile; look again and retry")
        if refresh is not None:
            if refresh.state in EXECUTING_STATES:
                raise InvalidTransition(
                    f"policy refresh #{refresh.pk} is running ({refresh.state}); "
                    + (
                        "it is resuming the engines of a namespace closed out a moment ago; "
                        "try again when it is held"
                        if refresh.end_state == RefreshState.HELD
                        else "abort it first"
                    )
                )
            if refresh.state == RefreshState.HELD:
                resolved = dict(refresh.resolved_namespaces or {})
                resolved[gate.namespace] = _namespace_outcome(FORCE_REOPENED, actor, reason)
                remaining = [ns for ns in refresh.namespaces if ns not in resolved]
                if remaining:
                    refresh.transition(
                        RefreshState.RELEASING,
                        end_state=RefreshState.HELD,
                        resolved_namespaces=resolved,
                    )
                    release_namespace_locks(refresh, [gate.namespace])
                else:
                    refresh.resolved_namespaces = resolved
                    refresh.transition(
                        RefreshState.RELEASING,
                        end_state=RefreshState.FAILED,
                        end_reason=f"gate {gate.namespace} force-reopened by {actor.label}: "
                        f"{reason}"
                        + (
                            f" (namespaces resolved one by one: {resolved_summary(refresh)})"
                            if len(resolved) > 1
                            else ""
                        ),
                        resolved_namespaces=resolved,
                    )
                _enqueue(refresh.pk)
        elif gate.is_open:
            raise InvalidTransition(f"gate {gate.source.name}/{gate.namespace} is already open")
        gates.force_open([gate], actor=actor, refresh=refresh, reason=reason)
        gate.refresh_from_db()
        notify("gate.force_reopened", gate=gate, refresh=refresh, reason=reason)
    if refresh is not None:
        transaction.on_commit(lambda: publish_state(refresh))
    return gate


def _gate_of_refresh(refresh: PolicyRefresh, namespace: str) -> Gate:
    if namespace not in (refresh.namespaces or []):
        raise ValidationError(
            f"namespace {namespace!r} is not in the scope of policy refresh #{refresh.pk}"
        )
    gate = Gate.objects.filter(source=refresh.source, namespace=namespace).first()
    if gate is None:
        raise InvalidTransition(f"policy refresh #{refresh.pk} never closed gate {namespace}")
    return gate


def force_reopen_namespace(
    refresh: PolicyRefresh, namespace: str, *, actor: Actor, reason: str
) -> PolicyRefresh:
    """Force-reopen one namespace of a refresh (its gate), from the refresh's own page."""
    if not namespace or not namespace.strip():
        raise ValidationError("name the namespace whose gate to force-reopen")
    force_reopen_gate(_gate_of_refresh(refresh, namespace.strip()), actor=actor, reason=reason)
    refresh.refresh_from_db()
    return refresh


MEMBERSHIP_STEPS = (StepName.RESOLVE, StepName.REOPEN)


def is_membership_hold(refresh: PolicyRefresh) -> bool:
    """Held by a membership check that named who left, joined or changed."""
    change = refresh.membership_change or {}
    return (
        refresh.state == RefreshState.HELD
        and refresh.failed_step in MEMBERSHIP_STEPS
        and any(change.get(k) for k in ("left", "joined", "changed"))
    )


def resolve_membership(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """Resolve a membership hold as the default rule says, in one action.

    Drop the leavers (recorded as departed, like a retry records workers that left), and the
    workers listed changed (an error, a moved admin route); leave the joiners out of the
    verified set — the gate counts them in `unverified_count` and the drift reconciler
    quarantines and catches them up — then run the held step again: the reopen re-reads
    discovery and opens for the verified set (a hold at `resolve` goes on without them).
    """
    with transaction.atomic():
        refresh = _locked(refresh)
        if not is_membership_hold(refresh):
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is {refresh.state}"
                + (f" at {refresh.failed_step}" if refresh.failed_step else "")
                + ", not held on a membership change"
            )
        change = refresh.membership_change
        step = StepName(refresh.failed_step)
        dropped_keys = set(change.get("left", [])) | {c["key"] for c in change.get("changed", [])}
        already = set(
            refresh.results.filter(status=DEPARTED).values_list("planned_worker_id", flat=True)
        )
        dropped = [w for w in refresh.workers.filter(key__in=dropped_keys) if w.pk not in already]
        # Changed workers are still listed: left out too, so the reopen does not see them join.
        left_out = sorted(
            set(refresh.left_out or [])
            | set(change.get("joined", []))
            | {c["key"] for c in change.get("changed", [])}
        )
        attempt = refresh.steps.filter(name=step).count()
        refresh.transition(
            STEP_STATE[step],
            held_reason="",
            abort_requested=False,
            left_out=left_out,
            membership_change={},
        )
        changed = {c["key"]: c["detail"] for c in change.get("changed", [])}
        # Leavers in one record; each changed worker with its own detail.
        for gone in [[w for w in dropped if w.key not in changed]] + [
            [w] for w in dropped if w.key in changed
        ]:
            if not gone:
                continue
            why = (
                f"changed since verified ({changed[gone[0].key]})"
                if gone[0].key in changed
                else LEFT_THE_FLEET.format(source=refresh.source.name)
            )
            write_departures(
                refresh,
                gone,
                step=step,
                attempt=max(attempt, 1),
                reason=f"{why}; dropped by {actor.label}",
                actor=actor,
                outcome="dropped from the refresh by a person; not in the verified set",
            )
        _audit(
            AuditAction.POLICY_REFRESH_MEMBERSHIP_RESOLVED,
            refresh,
            actor,
            step=step.value,
            dropped=sorted(w.key for w in dropped),
            left_out=sorted(change.get("joined", [])),
            changed=change.get("changed", []),
            namespaces=change.get("namespaces", []),
        )
        _enqueue(refresh.pk)
    transaction.on_commit(lambda: publish_state(refresh))
    return refresh


def reopen_verified_namespaces(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """Open every namespace of a held refresh whose workers all passed verify, in one action.

    Each such gate becomes `open` with its verified instance set (confirmed against a fresh
    discovery: workers gone since are not in the set, listed ones outside it are counted
    unverified); the others stay closed with their reasons and the refresh stays held for
    them. When no namespace is left, the refresh ends succeeded.
    """
    with transaction.atomic():
        refresh = _locked(refresh)
        if refresh.state != RefreshState.HELD:
            raise InvalidTransition(f"policy refresh #{refresh.pk} is {refresh.state}, not held")
    run, problem = _fresh_discovery(refresh.source)  # network I/O: outside any transaction
    if problem:
        raise InvalidTransition(f"cannot confirm who serves before reopening: {problem}")
    with transaction.atomic():
        refresh = _locked(refresh)
        if refresh.state != RefreshState.HELD:
            raise InvalidTransition(f"policy refresh #{refresh.pk} is {refresh.state}, not held")
        namespaces = verified_namespaces(refresh)
        if not namespaces:
            raise InvalidTransition(
                f"no namespace of policy refresh #{refresh.pk} has every worker verified; "
                "retry, force-reopen a namespace or abort"
            )
        verified, unverified = verified_instance_sets(refresh, namespaces)
        live = set(
            Worker.objects.filter(
                source=refresh.source, namespace__in=namespaces, state=WorkerState.LIVE
            ).values_list("instance_id", flat=True)
        )
        verified = {ns: [i for i in ids if i in live] for ns, ids in verified.items()}
        resolved = dict(refresh.resolved_namespaces or {})
        for namespace in namespaces:
            resolved[namespace] = _namespace_outcome(REOPENED, actor)
        refresh.resolved_namespaces = resolved
        remaining = [ns for ns in refresh.namespaces if ns not in resolved]
        if remaining:
            refresh.save(update_fields=["resolved_namespaces"])
            release_namespace_locks(refresh, namespaces)
        else:
            refresh.transition(
                RefreshState.SUCCEEDED,
                resolved_namespaces=resolved,
                end_reason=f"every namespace resolved on its own: {resolved_summary(refresh)}"[
                    :4000
                ],
            )
            gates.release_scope(refresh, "")
        gates.open_gates_verified(
            refresh, actor=actor, verified=verified, unverified=unverified, namespaces=namespaces
        )
        _audit(
            AuditAction.POLICY_REFRESH_NAMESPACES_REOPENED,
            refresh,
            actor,
            namespaces=namespaces,
            verified={ns: len(ids) for ns, ids in verified.items()},
            still_held=remaining,
            discovery_run=run.pk if run else None,
        )
        if not remaining:
            _audit(
                AuditAction.POLICY_REFRESH_SUCCEEDED,
                refresh,
                actor,
                weight_version=refresh.weight_version,
            )
            notify("refresh.succeeded", refresh=refresh)
    transaction.on_commit(lambda: publish_state(refresh))
    return refresh
