"""Gate reads and writes, and the release of a refresh's scope.

Every gate change bumps `revision`, is audited and published (`refresh.live`).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.refresh.live import publish_gate_changes
from controlplane.refresh.models import Gate, ScopeLock


def gate_for(source, namespace: str) -> Gate:
    lockorder.domain_lock("gates")
    gate, _ = Gate.objects.get_or_create(source=source, namespace=namespace)
    return gate


def gate_state(source, namespace: str) -> dict[str, Any]:
    """What trainers and rollout frameworks read: is the namespace open, at which version."""
    gate = Gate.objects.filter(source=source, namespace=namespace).first()
    if gate is None:
        # Never refreshed: admission is open and nothing has been verified yet.
        return {
            "source": source.name,
            "namespace": namespace,
            "open": True,
            "verified_version": None,
            "active_refresh_id": None,
            "reason": "",
            "revision": 0,
            "updated_at": None,
        }
    return serialize_gate(gate)


def serialize_gate(gate: Gate) -> dict[str, Any]:
    return {
        "source": gate.source.name,
        "source_id": gate.source_id,
        "namespace": gate.namespace,
        "open": gate.is_open,
        "verified_version": gate.verified_version,
        "active_refresh_id": gate.active_refresh_id,
        "reason": gate.closed_reason,
        "revision": gate.revision,
        "updated_at": gate.updated_at.isoformat() if gate.updated_at else None,
    }


def _announce(gates: list[Gate]) -> None:
    payloads = [serialize_gate(g) for g in gates]
    transaction.on_commit(lambda: publish_gate_changes(payloads))


def _change(
    gates: list[Gate], action: AuditAction, *, actor: Actor, refresh, note: str = "", **fields
) -> None:
    ids = [g.pk for g in gates]
    lockorder.domain_lock("gates")  # all gate updates first, then their audit rows
    Gate.objects.filter(pk__in=ids).update(revision=F("revision") + 1, **fields)
    fresh = list(Gate.objects.filter(pk__in=ids).select_related("source"))
    for gate in fresh:
        record(
            action,
            actor=actor,
            target=gate,
            details={
                "namespace": gate.namespace,
                "refresh_id": refresh.pk if refresh else None,
                "verified_version": gate.verified_version,
                "reason": note or gate.closed_reason,
            },
            correlation_id=refresh.correlation_id if refresh else None,
        )
    _announce(fresh)


def close_gates(refresh, *, actor: Actor, reason: str) -> None:
    gates = [gate_for(refresh.source, ns) for ns in refresh.namespaces]
    _change(
        gates,
        AuditAction.GATE_CLOSED,
        actor=actor,
        refresh=refresh,
        is_open=False,
        closed_reason=reason,
        active_refresh=refresh,
    )


def open_gates_verified(refresh, *, actor: Actor) -> None:
    gates = [gate_for(refresh.source, ns) for ns in refresh.namespaces]
    _change(
        gates,
        AuditAction.GATE_OPENED,
        actor=actor,
        refresh=refresh,
        is_open=True,
        closed_reason="",
        active_refresh=None,
        verified_version=refresh.weight_version,
        verified_policy=refresh.target,
    )


def update_gate_reason(refresh, reason: str) -> None:
    """A held/aborted refresh explains why the gate is still closed (not a separate audit)."""
    gates = Gate.objects.filter(source=refresh.source, namespace__in=refresh.namespaces)
    lockorder.domain_lock("gates")
    gates.update(closed_reason=reason, revision=F("revision") + 1)
    _announce(list(gates.select_related("source")))


def force_open(gates: list[Gate], *, actor: Actor, refresh, reason: str) -> None:
    _change(
        gates,
        AuditAction.GATE_FORCE_REOPENED,
        actor=actor,
        refresh=refresh,
        note=reason,
        is_open=True,
        closed_reason="",
        active_refresh=None,
    )


def release_scope(refresh, reason: str) -> None:
    """The refresh no longer owns its scope: drop the locks and detach the gates."""
    lockorder.domain_lock("scope locks")
    ScopeLock.objects.filter(refresh=refresh).delete()
    detach_refresh(refresh, reason)


def detach_refresh(refresh, reason: str) -> None:
    """The refresh ended: gates stop naming it. A closed gate keeps saying why it is closed."""
    lockorder.domain_lock("gates")
    closed = Gate.objects.filter(active_refresh=refresh, is_open=False)
    if reason:
        closed.update(closed_reason=reason, revision=F("revision") + 1)
    touched = list(Gate.objects.filter(active_refresh=refresh).select_related("source"))
    Gate.objects.filter(active_refresh=refresh).update(active_refresh=None)
    if touched:
        _announce(touched)
