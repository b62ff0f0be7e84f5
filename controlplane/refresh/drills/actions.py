"""`start_drill`: the one way a rollback drill begins (the source page's button, `manage.py
drill`, the source's schedule). It checks everything a person can be told before anything is
touched, writes the drill and its audit row in one transaction and enqueues the runner on
commit."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction

from controlplane import lockorder
from controlplane.accounts.roles import Perm
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.fleet.models import Source
from controlplane.refresh.drill_history import pick_subset, previous_policy
from controlplane.refresh.drill_hold import serialize_scope
from controlplane.refresh.drills import runner
from controlplane.refresh.errors import InvalidTransition, RefreshConflict
from controlplane.refresh.models import DrillRun, Gate, GateState, ScopeLock
from controlplane.textlimits import LABEL_CHARS

#: Workers per namespace a drill takes unless told otherwise.
DEFAULT_COUNT = 1


def _require(actor: Actor) -> None:
    if actor.user is not None and not actor.user.has_perm(Perm.OPERATE_REFRESH.value):
        raise PermissionDenied(f"{actor.label} may not run rollback drills (needs operate)")


def _gates(source: Source, namespaces: Sequence[str] | None) -> list[Gate]:
    gates = list(Gate.objects.filter(source=source).order_by("namespace"))
    if namespaces:
        known = {g.namespace: g for g in gates}
        unknown = sorted(set(namespaces) - set(known))
        if unknown:
            raise ValidationError(
                f"{source.name} has no gate for namespace(s) {', '.join(unknown)}"
            )
        return [known[ns] for ns in sorted(set(namespaces))]
    # Every namespace a refresh has verified; the rest have nothing to roll back to.
    return [g for g in gates if g.verified_policy]


def _check_gate(gate: Gate) -> None:
    where = f"{gate.source.name}/{gate.namespace}"
    if gate.state != GateState.OPEN or not gate.verified_policy:
        raise InvalidTransition(
            f"gate {where} is {gate.get_state_display()}; a drill needs an open, verified gate"
        )


def _conflicts(source: Source, namespaces: list[str]) -> None:
    lock = (
        ScopeLock.objects.filter(source=source, namespace__in=namespaces)
        .select_related("refresh")
        .first()
    )
    if lock is not None:
        raise RefreshConflict(
            f"policy refresh #{lock.refresh_id} ({lock.refresh.state}) is active on "
            f"{source.name}/{lock.namespace}; a drill waits until it ends",
            active_refresh_id=lock.refresh_id,
        )
    running = DrillRun.objects.filter(source=source, outcome="running").first()
    if running is not None:
        raise RefreshConflict(f"rollback drill #{running.pk} is still running on {source.name}")


def _subset(gates: list[Gate], count: int | None, instances: Sequence[str] | None) -> list[str]:
    if instances:
        named = [str(i).strip() for i in instances]
        verified = {i: g for g in gates for i in g.verified_instances}
        outside = [i for i in named if i not in verified]
        if outside:
            raise ValidationError(
                f"instance(s) {', '.join(outside)} are not verified workers of the drilled "
                "namespaces"
            )
        taken: dict[str, int] = {}
        for i in named:
            taken[verified[i].namespace] = taken.get(verified[i].namespace, 0) + 1
        for gate in gates:
            if taken.get(gate.namespace, 0) >= len(gate.verified_instances):
                raise ValidationError(
                    f"a drill keeps at least one worker of {gate.namespace} serving; "
                    "name fewer instances"
                )
        return sorted(set(named), key=int)
    count = DEFAULT_COUNT if count is None else count
    if count < 1:
        raise ValidationError("a drill takes at least one worker per namespace")
    chosen: list[str] = []
    for gate in gates:
        if count >= len(gate.verified_instances):
            raise ValidationError(
                f"{gate.namespace} has {len(gate.verified_instances)} verified worker(s); a "
                f"drill of {count} would leave none serving"
            )
        chosen += pick_subset(gate, count)
    return chosen


def start_drill(
    source: Source,
    *,
    actor: Actor,
    namespaces: Sequence[str] | None = None,
    count: int | None = None,
    instances: Sequence[str] | None = None,
    scheduled: bool = False,
    enqueue: bool = True,
) -> DrillRun:
    """Begin a rollback drill of `source` (default: every verified namespace, one worker
    each). Refuses — changing nothing — when a refresh (running, waiting or held) or another
    drill is active on the source (RefreshConflict, checked first), a gate is not open and
    verified or has no earlier verified policy (InvalidTransition), or the subset is bad
    (ValidationError)."""
    _require(actor)
    if count is not None and instances:
        raise ValidationError("give a count or named instances, not both")
    gates = _gates(source, namespaces)
    if not gates:
        raise InvalidTransition(f"{source.name} has no verified namespace to drill")
    names = [g.namespace for g in gates]
    # Before the gates: a held refresh closes its gates, and a scope a refresh holds is a
    # reason to wait (the schedule skips it), not a reason the drill cannot run at all.
    _conflicts(source, names)
    for gate in gates:
        _check_gate(gate)
    current = {g.namespace: g.verified_policy for g in gates}
    if len({repr(sorted(p.items())) for p in current.values() if p}) > 1:
        raise InvalidTransition(
            "the namespaces stand at different policies; drill them one at a time (--namespace)"
        )
    previous = {g.namespace: previous_policy(g) for g in gates}
    missing = sorted(ns for ns, p in previous.items() if p is None)
    if missing:
        raise InvalidTransition(
            f"no policy was verified before the current one on {', '.join(missing)}: "
            "there is nothing to roll back to yet"
        )
    if len({repr(sorted(p.items())) for p in previous.values() if p}) > 1:
        raise InvalidTransition(
            "the namespaces were verified at different earlier policies; drill them one at a "
            "time (--namespace)"
        )
    subset = _subset(gates, count, instances)
    try:
        with transaction.atomic():
            # Exclusive with a refresh start of this source: whichever commits first, the
            # other sees it (`drill_hold.py`); so the check is repeated under the lock.
            lockorder.domain_lock("scope locks")
            serialize_scope(source.pk)
            _conflicts(source, names)
            drill = DrillRun.objects.create(
                source=source,
                namespaces=names,
                instances=subset,
                current_policy=gates[0].verified_policy,
                previous_policy=previous[names[0]],
                scheduled=scheduled,
                requested_by=actor.user,
                requested_by_label=actor.label[:LABEL_CHARS],
            )
            record(
                AuditAction.DRILL_STARTED,
                actor=actor,
                target=drill,
                details={
                    "drill_id": drill.pk,
                    "source": source.name,
                    "namespaces": names,
                    "instances": subset,
                    "from_version": drill.current_version,
                    "to_version": drill.previous_version,
                    "scheduled": scheduled,
                },
                correlation_id=drill.correlation_id,
            )
            if enqueue:
                transaction.on_commit(lambda: runner.enqueue_drill(drill.pk))
    except IntegrityError:
        raise RefreshConflict(f"another rollback drill started on {source.name}") from None
    return drill
