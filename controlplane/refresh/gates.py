"""Gate reads and writes, and the release of a refresh's scope.

Every gate change bumps `revision`, is audited and published (`refresh.live`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.refresh.live import publish_gate_changes
from controlplane.refresh.models import ADMITTING_STATES, Gate, GateState, ScopeLock


def gate_for(source, namespace: str) -> Gate:
    lockorder.domain_lock("gates")
    gate, _ = Gate.objects.get_or_create(source=source, namespace=namespace)
    return gate


def gate_state(source, namespace: str) -> dict[str, Any]:
    """What trainers and rollout frameworks read: is the namespace open, at which version."""
    gate = Gate.objects.filter(source=source, namespace=namespace).select_related("source").first()
    if gate is None:
        # Never refreshed: admission is open and nothing has been verified yet.
        return {
            "source": source.name,
            "namespace": namespace,
            "state": GateState.OPEN.value,
            "open": True,
            "since": None,
            "reason": "",
            "forced": None,
            "verified_version": None,
            "verified_instances": [],
            "verified_count": 0,
            "unverified_count": 0,
            "confirmed_at": None,
            "drift": [],
            "drift_count": 0,
            "active_refresh_id": None,
            "revision": 0,
            "updated_at": None,
        }
    return serialize_gate(gate)


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def displayed_reason(gate: Gate) -> str:
    """Why the gate is in its state, in words (an unknown gate names the stale source)."""
    if gate.state == GateState.UNKNOWN:
        stale = gate.source.stale_reason or "no recent discovery"
        return f"source {gate.source.name} is stale: {stale}"
    return gate.reason


def serialize_gate(gate: Gate) -> dict[str, Any]:
    forced = None
    if gate.state == GateState.OPEN_FORCED:
        forced = {"by": gate.forced_by, "at": _iso(gate.forced_at), "reason": gate.reason}
    return {
        "source": gate.source.name,
        "source_id": gate.source_id,
        "namespace": gate.namespace,
        "state": gate.state,
        "open": gate.is_open,
        "since": _iso(gate.since),
        "reason": displayed_reason(gate),
        "forced": forced,
        "verified_version": gate.verified_version,
        "verified_instances": list(gate.verified_instances),
        "verified_count": len(gate.verified_instances),
        "unverified_count": gate.unverified_count,
        "confirmed_at": _iso(gate.confirmed_at),
        "drift": list(gate.drift),
        "drift_count": len(gate.drift),
        "active_refresh_id": gate.active_refresh_id,
        "revision": gate.revision,
        "updated_at": _iso(gate.updated_at),
    }


def _announce(gates: list[Gate]) -> None:
    payloads = [serialize_gate(g) for g in gates]
    transaction.on_commit(lambda: publish_gate_changes(payloads))


def _update(ids, *, state: str | None = None, now=None, **fields) -> None:
    """One UPDATE for the gates `ids`: revision and `updated_at` always move; `since` moves only
    for the gates whose state changes (SQL evaluates the CASE against the row before the
    update)."""
    now = now or timezone.now()
    if state is not None:
        fields["state"] = state
        fields["since"] = Case(When(~Q(state=state), then=Value(now)), default=F("since"))
    lockorder.domain_lock("gates")
    Gate.objects.filter(pk__in=ids).update(revision=F("revision") + 1, updated_at=now, **fields)


def _change(
    gates: list[Gate],
    action: AuditAction,
    *,
    actor: Actor,
    refresh,
    note: str = "",
    state: str | None = None,
    per_gate: Mapping[int, Mapping[str, Any]] | None = None,
    **fields,
) -> list[Gate]:
    ids = [g.pk for g in gates]
    now = timezone.now()
    _update(ids, state=state, now=now, **fields)
    for gate_id, values in (per_gate or {}).items():
        Gate.objects.filter(pk=gate_id).update(**values)
    fresh = list(Gate.objects.filter(pk__in=ids).select_related("source"))
    for gate in fresh:
        record(
            action,
            actor=actor,
            target=gate,
            details={
                "namespace": gate.namespace,
                "state": gate.state,
                "refresh_id": refresh.pk if refresh else None,
                "verified_version": gate.verified_version,
                "verified_count": len(gate.verified_instances),
                "reason": note or gate.reason,
            },
            correlation_id=refresh.correlation_id if refresh else None,
        )
    _announce(fresh)
    return fresh


_NOT_FORCED = {"forced_by": "", "forced_at": None}


def close_gates(refresh, *, actor: Actor, reason: str) -> None:
    gates = [gate_for(refresh.source, ns) for ns in refresh.namespaces]
    _change(
        gates,
        AuditAction.GATE_CLOSED,
        actor=actor,
        refresh=refresh,
        state=GateState.CLOSED,
        reason=reason,
        active_refresh=refresh,
        state_before_unknown="",
        **_NOT_FORCED,
    )


def open_gates_verified(
    refresh,
    *,
    actor: Actor,
    verified: Mapping[str, Sequence[str]],
    unverified: Mapping[str, int] | None = None,
    namespaces: Sequence[str] | None = None,
) -> None:
    """Open the refresh's gates at its version for exactly the instances verified at it.

    `verified` maps each namespace to the instance ids (decimal strings) verified at the
    refresh's version; `unverified` counts the serving workers of a namespace left out.
    `namespaces` opens only those (a refresh resolved namespace by namespace); default: all.
    """
    namespaces = refresh.namespaces if namespaces is None else namespaces
    gates = [gate_for(refresh.source, ns) for ns in sorted(namespaces)]
    unverified = unverified or {}
    per_gate = {
        g.pk: {
            "verified_instances": sorted(set(verified.get(g.namespace, ())), key=int),
            "unverified_count": unverified.get(g.namespace, 0),
        }
        for g in gates
    }
    _change(
        gates,
        AuditAction.GATE_OPENED,
        actor=actor,
        refresh=refresh,
        state=GateState.OPEN,
        per_gate=per_gate,
        reason="",
        active_refresh=None,
        verified_version=refresh.weight_version,
        verified_policy=refresh.target,
        confirmed_at=timezone.now(),
        drift=[],
        state_before_unknown="",
        **_NOT_FORCED,
    )


def update_gate_reason(refresh, reason: str) -> None:
    """A held/aborted refresh explains why the gate is still closed (not a separate audit).

    Only the gates the refresh still holds: a namespace resolved on its own (force-reopened,
    reopened verified) keeps its own state and reason."""
    gates = Gate.objects.filter(active_refresh=refresh)
    _update(list(gates.values_list("pk", flat=True)), reason=reason)
    _announce(list(gates.select_related("source")))


def force_open(gates: list[Gate], *, actor: Actor, refresh, reason: str) -> None:
    """Opened by a person without verification: never shown like a verified `open`."""
    _change(
        gates,
        AuditAction.GATE_FORCE_REOPENED,
        actor=actor,
        refresh=refresh,
        note=reason,
        state=GateState.OPEN_FORCED,
        reason=reason,
        forced_by=actor.label,
        forced_at=timezone.now(),
        active_refresh=None,
        state_before_unknown="",
    )


def mark_source_unknown(source, *, actor: Actor) -> list[Gate]:
    """The source went stale: its admitting gates become `unknown` (closed ones stay closed,
    which already tells trainers not to send rollouts). The state to return to is kept."""
    gates = list(Gate.objects.filter(source=source, state__in=ADMITTING_STATES))
    if not gates:
        return []
    for state in {g.state for g in gates}:
        same = [g for g in gates if g.state == state]
        _update([g.pk for g in same], state=GateState.UNKNOWN, state_before_unknown=state)
    return _audited(gates, AuditAction.GATE_UNKNOWN, actor=actor)


def restore_source_known(source, *, actor: Actor) -> list[Gate]:
    """The stale source answers again: `unknown` gates return to the state they had."""
    gates = list(Gate.objects.filter(source=source, state=GateState.UNKNOWN))
    for gate in gates:
        _update([gate.pk], state=gate.state_before_unknown or GateState.CLOSED)
        Gate.objects.filter(pk=gate.pk).update(state_before_unknown="")
    return _audited(gates, AuditAction.GATE_KNOWN, actor=actor) if gates else []


def _audited(gates: list[Gate], action: AuditAction, *, actor: Actor) -> list[Gate]:
    fresh = list(Gate.objects.filter(pk__in=[g.pk for g in gates]).select_related("source"))
    for gate in fresh:
        record(
            action,
            actor=actor,
            target=gate,
            details={
                "namespace": gate.namespace,
                "state": gate.state,
                "reason": displayed_reason(gate),
            },
        )
    _announce(fresh)
    return fresh


def release_scope(refresh, reason: str) -> None:
    """The refresh no longer owns its scope: drop the locks and detach the gates."""
    lockorder.domain_lock("scope locks")
    ScopeLock.objects.filter(refresh=refresh).delete()
    detach_refresh(refresh, reason)


def detach_refresh(refresh, reason: str) -> None:
    """The refresh ended: gates stop naming it. A closed gate keeps saying why it is closed."""
    lockorder.domain_lock("gates")
    closed = Gate.objects.filter(active_refresh=refresh, state=GateState.CLOSED)
    if reason:
        _update(list(closed.values_list("pk", flat=True)), reason=reason)
    touched = list(Gate.objects.filter(active_refresh=refresh).select_related("source"))
    Gate.objects.filter(active_refresh=refresh).update(active_refresh=None)
    if touched:
        _announce(touched)
