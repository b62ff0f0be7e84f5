"""Getting a scope back after a refresh went wrong: roll back to the last verified policy, force
a gate or a namespace open, accept a membership change, reopen the verified namespaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source, Worker, WorkerState
from controlplane.notify.emit import notify
from controlplane.refresh import gates
from controlplane.refresh.departed import DEPARTED
from controlplane.refresh.errors import (
    InvalidTransition,
    PlanBlocked,
    wrong_state,
)
from controlplane.refresh.executor.departures import LEFT_THE_FLEET, write_departures
from controlplane.refresh.executor.steps import verified_instance_sets
from controlplane.refresh.intents import base
from controlplane.refresh.intents.base import audit_refresh, locked_refresh, scope_conflict
from controlplane.refresh.intents.lifecycle import start_policy_refresh
from controlplane.refresh.intents.plan import fresh_discovery, plan_policy_refresh
from controlplane.refresh.intents.queries import (
    is_membership_hold,
    last_verified_policy,
    resolved_summary,
)
from controlplane.refresh.ledger import Readback
from controlplane.refresh.live import publish_state, publish_state_on_commit
from controlplane.refresh.membership import (
    change_of,
    changed_details,
    dropped_keys,
    left_out_keys,
)
from controlplane.refresh.models import (
    EXECUTING_STATES,
    WAITING_STATES,
    Evidence,
    Gate,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
)
from controlplane.refresh.namespaces import (
    FORCE_REOPENED,
    REOPENED,
    release_namespace_locks,
    verified_namespaces,
    with_resolved,
)
from controlplane.refresh.progress import previous_policy
from controlplane.refresh.revisions import revision_history
from controlplane.refresh.step_order import STEP_STATE, StepName
from controlplane.refresh.strategy import (
    rollback_strategy,
    stored,
)
from controlplane.textlimits import LABEL_CHARS, STATE_REASON_CHARS

__all__ = [
    "ROLLBACK_STATES",
    "force_reopen_gate",
    "force_reopen_namespace",
    "plan_rollback",
    "reopen_verified_namespaces",
    "resolve_membership",
    "rollback_policy_refresh",
    "start_rollback_plan",
    "still_held_namespaces",
]


#: States a rollback takes a refresh over from.
ROLLBACK_STATES = frozenset({RefreshState.HELD, *WAITING_STATES})


def rollback_policy_refresh(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """A new refresh of the same scope to its last verified policy; it inherits the scope.

    From a staged refresh (held, or waiting between waves) the policy is the one its gates
    stood for before it began (an `admit_as_verified` gate may already stand for the new one),
    and the rollback runs in waves of the same size, so rolling back does not empty the fleet.
    """
    if refresh.state not in ROLLBACK_STATES:
        raise wrong_state(refresh, wanted="held")
    policy = previous_policy(refresh) or last_verified_policy(refresh.source, refresh.namespaces)
    if policy is None:
        raise InvalidTransition("this scope has no verified policy to roll back to")
    new = plan_policy_refresh(
        source=refresh.source,
        actor=actor,
        target=dict(policy),
        namespaces=refresh.namespaces,
        pause_mode=refresh.pause_mode,
        pause_modes=refresh.pause_modes,
        inflight_may_straddle=refresh.inflight_may_straddle,
        verification=refresh.verification,
        rollback_of=refresh,
        flush_policy=refresh.flush_policy,
        strategy=rollback_strategy(stored(refresh)),
    )
    if new.plan_blockers:
        raise PlanBlocked("the rollback plan has blockers: " + "; ".join(new.plan_blockers))
    with transaction.atomic(durable=True):
        old = locked_refresh(refresh)
        if old.state not in ROLLBACK_STATES:
            raise wrong_state(old, wanted="held")
        new = _take_over(old, locked_refresh(new), actor, policy)
    _publish_both(old, new)
    return new


def _take_over(
    old: PolicyRefresh, new: PolicyRefresh, actor: Actor, policy: Mapping[str, Any]
) -> PolicyRefresh:
    """The rollback `new` takes over the scope of `old` (locked, held or waiting) and runs;
    `old` ends `rolled_back`. Inside the caller's transaction, both rows locked."""
    # The rollback takes over the scope (and the paused workers) without a gap.
    ScopeLock.objects.filter(refresh=old).update(refresh=new)
    Gate.objects.filter(active_refresh=old).update(active_refresh=new)
    old.transition(RefreshState.ROLLED_BACK, end_reason=f"rolled back by policy refresh #{new.pk}")
    needs_approval = new.source.require_approval
    new.transition(RefreshState.AWAITING_APPROVAL if needs_approval else RefreshState.GATING)
    audit_refresh(
        AuditAction.POLICY_REFRESH_ROLLED_BACK,
        old,
        actor,
        rollback_refresh_id=new.pk,
        target=policy,
    )
    audit_refresh(AuditAction.POLICY_REFRESH_REQUESTED, new, actor, needs_approval=needs_approval)
    if needs_approval:
        notify("refresh.awaiting_approval", refresh=new)
    else:
        audit_refresh(AuditAction.POLICY_REFRESH_STARTED, new, actor)
        base.enqueue_execution(new.pk)
    return new


def _publish_both(old: PolicyRefresh, new: PolicyRefresh) -> None:
    def publish_both() -> None:
        publish_state(old)
        publish_state(new)

    transaction.on_commit(publish_both)


# -- a rollback through a plan (the refresh page's Roll back) -----------------------------------


def still_held_namespaces(refresh: PolicyRefresh) -> list[str]:
    """The namespaces a held or waiting refresh still owns (its scope locks): a rollback that
    takes it over must cover them. A force-reopened namespace is no longer among them."""
    if refresh.state not in ROLLBACK_STATES:
        return []
    return sorted(ScopeLock.objects.filter(refresh=refresh).values_list("namespace", flat=True))


def plan_rollback(
    source: Source,
    *,
    actor: Actor,
    version: str,
    namespaces: list[str],
    of: PolicyRefresh | None = None,
) -> PolicyRefresh:
    """A planned refresh back to an earlier verified version (`version`: a revision's key,
    `revisions.version_key`), of the chosen namespaces only; it is reviewed and started on the
    plan page like any plan (`start_rollback_plan`), never started here.

    `of` is the refresh being rolled back (its pause, flush and verification settings are
    kept, its waves become the rollback's): while it is held or waiting, the plan must cover
    every namespace it still holds, since the rollback takes its scope over. The namespaces a
    person force-reopened are no longer held: they are in the plan only if chosen.
    """
    revision = next((r for r in revision_history(source, limit=500) if r.key == version), None)
    if revision is None:
        raise ValidationError(f"{version} is not a verified version of {source.name}")
    chosen = sorted(set(namespaces))
    if not chosen:
        raise ValidationError("choose at least one namespace to roll back")
    if of is not None:
        if of.source_id != source.pk:
            raise ValidationError(f"policy refresh #{of.pk} is not on {source.name}")
        missing = [ns for ns in still_held_namespaces(of) if ns not in chosen]
        if missing:
            raise ValidationError(
                f"policy refresh #{of.pk} still holds {', '.join(missing)}: include "
                f"{'it' if len(missing) == 1 else 'them'} in the rollback, or resolve "
                f"{'it' if len(missing) == 1 else 'them'} on its page first"
            )
    kept: dict = {}
    if of is not None:
        kept = {
            "pause_mode": of.pause_mode,
            "pause_modes": of.pause_modes,
            "inflight_may_straddle": of.inflight_may_straddle,
            "verification": of.verification,
            "flush_policy": of.flush_policy,
            "strategy": rollback_strategy(stored(of)),
        }
    return plan_policy_refresh(
        source=source,
        actor=actor,
        target=dict(revision.policy),
        namespaces=chosen,
        rollback_of=of,
        **kept,
    )


def start_rollback_plan(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """Start a planned rollback: like `start_policy_refresh`, but while the refresh it rolls
    back is still held or waiting, it takes that one's scope over (`_take_over`) and the
    namespaces it adds are locked for it."""
    old = refresh.rollback_of
    if old is None or old.state not in ROLLBACK_STATES:
        return start_policy_refresh(refresh, actor=actor)
    if refresh.plan_blockers:
        raise PlanBlocked("the plan has blockers: " + "; ".join(refresh.plan_blockers))
    with transaction.atomic(durable=True):
        old = locked_refresh(old)
        if old.state not in ROLLBACK_STATES:
            raise wrong_state(old, wanted="held")
        new = locked_refresh(refresh)
        if new.state != RefreshState.PLANNED:
            raise wrong_state(new, wanted="planned")
        held = still_held_namespaces(old)
        missing = [ns for ns in held if ns not in new.namespaces]
        if missing:
            raise InvalidTransition(
                f"policy refresh #{old.pk} still holds {', '.join(missing)}, which this plan "
                "leaves out; plan the rollback again"
            )
        added = [ns for ns in sorted(new.namespaces) if ns not in held]
        if added:
            lockorder.domain_lock("scope locks")
            try:
                with transaction.atomic():
                    ScopeLock.objects.bulk_create(
                        ScopeLock(source=new.source, namespace=ns, refresh=new) for ns in added
                    )
            except IntegrityError:
                raise scope_conflict(new.source, added) from None
        new = _take_over(old, new, actor, new.target)
    _publish_both(old, new)
    return new


def force_reopen_gate(gate: Gate, *, actor: Actor, reason: str) -> Gate:
    """Open a closed gate on a person's written say-so, for its namespace only.

    A held refresh on the gate loses just that namespace: the executor resumes the engines it
    paused there and holds again for the other namespaces, which keep their own recoveries
    (retry, reopen all verified, force-reopen, abort). Force-reopening the last namespace still
    held closes the refresh out: its engines are resumed and it ends as failed.

    The gate admits what the workers actually serve: a fresh discovery reads back every
    worker's `get_weight_version` first, and each live worker is admitted, forced, at the
    version it reported. When no readback is possible (the listener is down), each is admitted
    at the last version discovery saw, with `unknown` evidence, and the gate says so.
    """
    if not reason or not reason.strip():
        raise ValidationError("force-reopening a gate needs a written reason")
    reason = reason.strip()
    gate = Gate.objects.select_related("source").get(pk=gate.pk)
    if gate.is_open and gate.active_refresh_id is None:
        raise InvalidTransition(f"gate {gate.source.name}/{gate.namespace} is already open")
    run, problem = fresh_discovery(gate.source)  # network I/O: outside any transaction
    with transaction.atomic():
        # Lock order: the refresh row before its gate (controlplane/lockorder.py).
        refresh = Gate.objects.get(pk=gate.pk).active_refresh
        if refresh is not None:
            refresh = locked_refresh(refresh)
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
                        else "it ends aborted within seconds; try again then"
                        if refresh.state == RefreshState.ABORTING
                        else "abort it first"
                    )
                )
            if refresh.state == RefreshState.HELD:
                resolved = with_resolved(
                    refresh,
                    [gate.namespace],
                    FORCE_REOPENED,
                    by=actor.label[:LABEL_CHARS],
                    reason=reason,
                )
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
                base.enqueue_execution(refresh.pk)
        elif gate.is_open:
            raise InvalidTransition(f"gate {gate.source.name}/{gate.namespace} is already open")
        readbacks = readbacks_of(gate, trusted=not problem)
        gates.force_open(
            [gate],
            actor=actor,
            refresh=refresh,
            reason=reason,
            readbacks={gate.namespace: readbacks},
            run=run if not problem else None,
        )
        gate.refresh_from_db()
        notify("gate.force_reopened", gate=gate, refresh=refresh, reason=reason)
    if refresh is not None:
        publish_state_on_commit(refresh)
    return gate


def readbacks_of(gate: Gate, *, trusted: bool) -> list[Readback]:
    """What each live worker of the gate's namespace reported at the last discovery: its
    readback (`reported`) when `trusted` (that discovery just ran) and it declared one."""
    out = []
    for worker in Worker.objects.filter(
        source=gate.source, namespace=gate.namespace, state=WorkerState.LIVE
    ).order_by("instance_id"):
        declared = (
            trusted
            and worker.version_probed_at is not None
            and not worker.version_error
            and worker.weight_version_declared
        )
        out.append(
            Readback(
                worker.instance_id,
                worker.key,
                worker.weight_version,
                Evidence.REPORTED if declared else Evidence.UNKNOWN,
            )
        )
    return out


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


def resolve_membership(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """Resolve a membership hold as the default rule says, in one action.

    Drop the leavers (recorded as departed, like a retry records workers that left), and the
    workers listed changed (an error, a moved admin route); leave the joiners out of the
    verified set — the gate counts them in `unverified_count` and the drift reconciler
    quarantines and catches them up — then run the held step again: the reopen re-reads
    discovery and opens for the verified set (a hold at `resolve` goes on without them).
    """
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        if not is_membership_hold(refresh):
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is {refresh.state}"
                + (f" at {refresh.failed_step}" if refresh.failed_step else "")
                + ", not held on a membership change"
            )
        change = change_of(refresh)
        step = StepName(refresh.failed_step)
        already = set(
            refresh.results.filter(status=DEPARTED).values_list("planned_worker_id", flat=True)
        )
        dropped = [
            w for w in refresh.workers.filter(key__in=dropped_keys(change)) if w.pk not in already
        ]
        # Changed workers are still listed: left out too, so the reopen does not see them join.
        left_out = sorted(set(refresh.left_out or []) | left_out_keys(change))
        attempt = refresh.steps.filter(name=step).count()
        refresh.transition(
            STEP_STATE[step],
            held_reason="",
            abort_requested=False,
            left_out=left_out,
            membership_change={},
        )
        changed = changed_details(change)
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
        audit_refresh(
            AuditAction.POLICY_REFRESH_MEMBERSHIP_RESOLVED,
            refresh,
            actor,
            step=step.value,
            dropped=sorted(w.key for w in dropped),
            left_out=sorted(change.get("joined", [])),
            changed=change.get("changed", []),
            namespaces=change.get("namespaces", []),
        )
        base.enqueue_execution(refresh.pk)
    publish_state_on_commit(refresh)
    return refresh


def reopen_verified_namespaces(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """Open every namespace of a held refresh whose workers all passed verify, in one action.

    Each such gate becomes `open` with its verified instance set (confirmed against a fresh
    discovery: workers gone since are not in the set, listed ones outside it are counted
    unverified); the others stay closed with their reasons and the refresh stays held for
    them. When no namespace is left, the refresh ends succeeded.
    """
    with transaction.atomic(durable=True):
        refresh = locked_refresh(refresh)
        if refresh.state != RefreshState.HELD:
            raise wrong_state(refresh, wanted="held")
    run, problem = fresh_discovery(refresh.source)  # network I/O: outside any transaction
    if problem:
        raise InvalidTransition(f"cannot confirm who serves before reopening: {problem}")
    with transaction.atomic(durable=True):
        refresh = locked_refresh(refresh)
        if refresh.state != RefreshState.HELD:
            raise wrong_state(refresh, wanted="held")
        namespaces = verified_namespaces(refresh)
        if not namespaces:
            raise InvalidTransition(
                f"no namespace of policy refresh #{refresh.pk} has every worker verified; "
                "retry, force-reopen a namespace or abort"
            )
        verified, _ = verified_instance_sets(refresh, namespaces)
        serving: dict[str, list[str]] = {ns: [] for ns in namespaces}
        for namespace, instance_id in Worker.objects.filter(
            source=refresh.source, namespace__in=namespaces, state=WorkerState.LIVE
        ).values_list("namespace", "instance_id"):
            serving[namespace].append(instance_id)
        verified = {
            ns: [i for i in ids if i in serving.get(ns, [])] for ns, ids in verified.items()
        }
        resolved = with_resolved(refresh, namespaces, REOPENED, by=actor.label[:LABEL_CHARS])
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
                    :STATE_REASON_CHARS
                ],
            )
            gates.release_scope(refresh, "")
        gates.open_gates_verified(
            refresh, actor=actor, verified=verified, serving=serving, namespaces=namespaces
        )
        audit_refresh(
            AuditAction.POLICY_REFRESH_NAMESPACES_REOPENED,
            refresh,
            actor,
            namespaces=namespaces,
            verified={ns: len(ids) for ns, ids in verified.items()},
            still_held=remaining,
            discovery_run=run.pk if run else None,
        )
        if not remaining:
            audit_refresh(
                AuditAction.POLICY_REFRESH_SUCCEEDED,
                refresh,
                actor,
                weight_version=refresh.weight_version,
            )
            notify("refresh.succeeded", refresh=refresh)
    publish_state_on_commit(refresh)
    return refresh
