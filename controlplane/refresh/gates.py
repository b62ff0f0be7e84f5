"""Gate reads and writes, and the release of a refresh's scope.

Every gate change bumps `revision`, is audited and published (`refresh.live`); a change of
state is also notified (`gate.opened`, `gate.closed`, `gate.unknown`: one notification per
source and change, listing its gates; `gate.force_reopened` is sent by the action itself).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.notify.emit import notify
from controlplane.refresh import gate_cache
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
            "instance_sets": {},
            "left_out": [],
            "left_out_count": 0,
            "active_refresh_id": None,
            "revision": 0,
            "updated_at": None,
        }
    return serialize_gate(gate)


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def displayed_reason(gate: Gate) -> str:
    """Why the gate is in its state, in words (an unknown gate names the stale source).

    An unknown gate keeps its own `reason` (a forced gate's written reason must survive the
    round trip through `unknown`), so the words for `unknown` come from the source."""
    if gate.state == GateState.UNKNOWN:
        source = gate.source
        if source.stale:
            return f"source {source.name} is stale: {source.stale_reason or 'listener failed'}"
        if source.last_success_at is None:
            return f"source {source.name} has no successful discovery"
        return (
            f"source {source.name} is stale: no successful discovery since "
            f"{source.last_success_at.isoformat()}"
        )
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
        # A staged refresh (waves, canary) in progress: which instances are on which version.
        "instance_sets": dict(gate.instance_sets or {}),
        # Workers a refresh's failure budget left out of the verified set, each with its reason
        # (they are quarantined; they leave this list when admitted or dropped).
        "left_out": left_out_entries(gate),
        "left_out_count": len(left_out_entries(gate)),
        "active_refresh_id": gate.active_refresh_id,
        "revision": gate.revision,
        "updated_at": _iso(gate.updated_at),
    }


def _copy_on_commit(ids) -> None:
    """Once committed, the rows of `ids` become the gate API's Redis copies (gate_cache.py).
    Registered before the push, so a client woken by it reads the new state."""
    ids = list(ids)
    if ids:
        rows = Gate.objects.filter(pk__in=ids).select_related("source")
        transaction.on_commit(lambda: gate_cache.store(serialize_gate(g) for g in rows.all()))


def _announce(gates: list[Gate]) -> None:
    payloads = [serialize_gate(g) for g in gates]
    _copy_on_commit(g.pk for g in gates)
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
    _copy_on_commit(ids)


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
    before = {g.pk: g.state for g in gates}
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
    if action != AuditAction.GATE_FORCE_REOPENED:  # the force-reopen action notifies itself
        _notify_state_changes(before, fresh, refresh=refresh, reason=note)
    _announce(fresh)
    return fresh


#: The notification sent when a gate enters a state. `open_forced` is only entered through
#: the force-reopen action (which sends `gate.force_reopened`) or by returning from `unknown`.
_STATE_EVENTS = {
    GateState.OPEN: "gate.opened",
    GateState.OPEN_FORCED: "gate.opened",
    GateState.CLOSED: "gate.closed",
    GateState.UNKNOWN: "gate.unknown",
}


def _notify_state_changes(
    before: Mapping[int, str], fresh: list[Gate], *, refresh=None, reason: str = ""
) -> None:
    """One notification per new state for the gates whose state changed (a refresh of three
    namespaces sends one `gate.closed`, not three; a gate already closed sends none)."""
    changed: dict[str, list[Gate]] = {}
    for gate in fresh:
        if before.get(gate.pk) != gate.state:
            changed.setdefault(_STATE_EVENTS[GateState(gate.state)], []).append(gate)
    for event, gates in changed.items():
        notify(event, source=gates[0].source, refresh=refresh, gates=gates, reason=reason)


_NOT_FORCED: dict[str, Any] = {"forced_by": "", "forced_at": None}


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
    left_out: Mapping[str, Sequence[dict[str, Any]]] | None = None,
) -> None:
    """Open the refresh's gates at its version for exactly the instances verified at it.

    `verified` maps each namespace to the instance ids (decimal strings) verified at the
    refresh's version; `unverified` counts the serving workers of a namespace left out.
    `namespaces` opens only those (a refresh resolved namespace by namespace); default: all.
    `left_out` lists per namespace the drift entries of workers the failure budget left out
    (kind `left_out`, quarantined): the gate shows how many and why.
    """
    namespaces = refresh.namespaces if namespaces is None else namespaces
    gates = [gate_for(refresh.source, ns) for ns in sorted(namespaces)]
    unverified = unverified or {}
    left_out = left_out or {}
    per_gate = {
        g.pk: {
            "verified_instances": sorted(set(verified.get(g.namespace, ())), key=int),
            "unverified_count": unverified.get(g.namespace, 0),
            "drift": list(left_out.get(g.namespace, [])),
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
        instance_sets={},
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


def _locked_in_states(source, states) -> list[Gate]:
    """The source's gates in `states`, locked (namespace order) so a refresh closing one of
    them meanwhile is seen before we decide (callers run inside a transaction)."""
    lockorder.domain_lock("gates")
    return list(
        Gate.objects.select_for_update(no_key=True, of=("self",))
        .filter(source=source, state__in=list(states))
        .order_by("namespace")
    )


def mark_source_unknown(source, *, actor: Actor) -> list[Gate]:
    """The source went stale: its admitting gates become `unknown` (closed ones stay closed,
    which already tells trainers not to send rollouts). The state to return to is kept."""
    gates = _locked_in_states(source, ADMITTING_STATES)
    if not gates:
        return []
    before = {g.pk: g.state for g in gates}
    for state in {g.state for g in gates}:
        same = [g for g in gates if g.state == state]
        _update([g.pk for g in same], state=GateState.UNKNOWN, state_before_unknown=state)
    return _audited(gates, AuditAction.GATE_UNKNOWN, actor=actor, before=before)


def restore_source_known(source, *, actor: Actor) -> list[Gate]:
    """The stale source answers again: `unknown` gates return to the state they had."""
    gates = _locked_in_states(source, [GateState.UNKNOWN])
    if not gates:
        return []
    before = {g.pk: g.state for g in gates}
    for gate in gates:
        _update(
            [gate.pk], state=gate.state_before_unknown or GateState.CLOSED, state_before_unknown=""
        )
    note = f"source {source.name} answers discovery again"
    return _audited(gates, AuditAction.GATE_KNOWN, actor=actor, before=before, note=note)


def _audited(
    gates: list[Gate],
    action: AuditAction,
    *,
    actor: Actor,
    before: Mapping[int, str],
    note: str = "",
) -> list[Gate]:
    fresh = list(Gate.objects.filter(pk__in=[g.pk for g in gates]).select_related("source"))
    for gate in fresh:
        record(
            action,
            actor=actor,
            target=gate,
            details={
                "namespace": gate.namespace,
                "state": gate.state,
                "reason": note or displayed_reason(gate),
            },
        )
    _notify_state_changes(before, fresh, reason=note or displayed_reason(fresh[0]))
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
    # A staged refresh's sets described its waves; drift reconciliation takes over from here.
    Gate.objects.filter(active_refresh=refresh).update(active_refresh=None, instance_sets={})
    if touched:
        _announce(touched)


# -- drift and quarantine (refresh/drift.py, refresh/quarantine.py) ---------------------------
# Appended here because this module is the only writer of gate rows. Every function takes the
# gate row lock itself (level 4 of `controlplane/lockorder.py`) and audits last.


def locked_gate(gate_id: int) -> Gate | None:
    lockorder.domain_lock("gates")
    return (
        Gate.objects.select_for_update(no_key=True, of=("self",))
        .select_related("source")
        .filter(pk=gate_id)
        .first()
    )


def record_drift(
    gate: Gate,
    *,
    actor: Actor,
    verified: Sequence[str],
    unverified_count: int,
    drift: list[dict[str, Any]],
    new: Sequence[dict[str, Any]] = (),
    close_reason: str = "",
) -> Gate:
    """Write what one discovery found for a gate the caller holds locked (`locked_gate`).

    `verified` is the verified set minus instances that left or drifted, `drift` the complete
    drift list, `new` the entries found this time (audited as drift) and `close_reason` set
    when the source's drift policy closes the gate. A discovery that changes nothing only
    moves `confirmed_at` (no revision, no push: trainers' ETags stay valid).
    """
    now = timezone.now()
    changes: dict[str, Any] = {}
    verified_sorted = sorted(set(verified), key=int)
    if verified_sorted != list(gate.verified_instances):
        changes["verified_instances"] = verified_sorted
    if unverified_count != gate.unverified_count:
        changes["unverified_count"] = unverified_count
    if drift != list(gate.drift):
        changes["drift"] = drift
    if not changes and not close_reason:
        Gate.objects.filter(pk=gate.pk).update(confirmed_at=now)
        _copy_on_commit([gate.pk])  # the API serves `confirmed_at`: same revision, new copy
        return gate
    named = "; ".join(f"{d['key']} ({d['kind']}: {d['detail']})" for d in new)
    if close_reason:
        return _change(
            [gate],
            AuditAction.GATE_CLOSED,
            actor=actor,
            refresh=None,
            note=close_reason,
            state=GateState.CLOSED,
            reason=close_reason,
            confirmed_at=now,
            state_before_unknown="",
            **_NOT_FORCED,
            **changes,
        )[0]
    action = AuditAction.GATE_DRIFT_RECORDED if new else AuditAction.GATE_RECONCILED
    note = f"drift: {named}" if new else "verified set confirmed by discovery"
    return _change(
        [gate], action, actor=actor, refresh=None, note=note, confirmed_at=now, **changes
    )[0]


@transaction.atomic
def set_drift_state(gate_id: int, instance_id: str, state: str, detail: str = "") -> None:
    """A quarantine moved on: its drift entry says so (the entry stays until admission/drop)."""
    gate = locked_gate(gate_id)
    if gate is None:
        return
    drift = [dict(d) for d in gate.drift]
    for entry in drift:
        if entry.get("instance_id") == instance_id:
            entry["state"] = state
            if detail:
                entry["detail"] = detail
    if drift != gate.drift:
        _update([gate.pk], drift=drift)
        _announce(list(Gate.objects.filter(pk=gate.pk).select_related("source")))


@transaction.atomic
def close_for_drift(gate_id: int, *, actor: Actor, reason: str) -> None:
    """Drift the control plane could not contain (a worker that cannot be paused)."""
    gate = locked_gate(gate_id)
    if gate is None:
        return
    if gate.state == GateState.CLOSED:  # already closed: add the worker to the reason
        _update([gate.pk], reason=(f"{gate.reason}; {reason}" if gate.reason else reason)[:2000])
        _announce(list(Gate.objects.filter(pk=gate.pk).select_related("source")))
        return
    _change(
        [gate],
        AuditAction.GATE_CLOSED,
        actor=actor,
        refresh=None,
        note=reason,
        state=GateState.CLOSED,
        reason=reason,
        state_before_unknown="",
        **_NOT_FORCED,
    )


@transaction.atomic
def admit_instance(
    gate_id: int, instance_id: str, *, version: Any, actor: Actor, note: str
) -> bool:
    """A caught-up worker joins the verified set, if the gate is still at `version`.

    False (nothing written) when the gate has moved to another version since the drift was
    found: the worker was verified at a policy the gate no longer stands for.
    """
    gate = locked_gate(gate_id)
    if gate is None or gate.verified_version != version:
        return False
    verified = sorted({*gate.verified_instances, instance_id}, key=int)
    drift = [d for d in gate.drift if d.get("instance_id") != instance_id]
    _change(
        [gate],
        AuditAction.GATE_INSTANCE_ADMITTED,
        actor=actor,
        refresh=None,
        note=note,
        verified_instances=verified,
        drift=drift,
        unverified_count=max(0, gate.unverified_count - 1),
    )
    return True


@transaction.atomic
def forget_drift(gate_id: int, instance_id: str) -> None:
    """The drifted instance is gone (dropped): its entry leaves the gate's drift list."""
    gate = locked_gate(gate_id)
    if gate is None:
        return
    drift = [d for d in gate.drift if d.get("instance_id") != instance_id]
    if drift != gate.drift:
        _update([gate.pk], drift=drift)
        _announce(list(Gate.objects.filter(pk=gate.pk).select_related("source")))


# -- staged refreshes (refresh/strategy.py): waves and canaries -------------------------------
# While a staged refresh runs its gates are not closed: they keep admitting the old version for
# exactly the instances still serving it, and `instance_sets` says which instances are on which
# version. The executor calls these inside its fenced transaction.


#: A staged refresh's instance sets (`Gate.instance_sets`).
_STAGED_SETS = ("serving_old", "in_flight", "verified_new", "left_out")


def _sets_of(gate: Gate) -> dict[str, Any]:
    sets = dict(gate.instance_sets or {})
    for name in _STAGED_SETS:
        sets[name] = list(sets.get(name, []))
    return sets


def _unverified_after(
    gate: Gate, before: dict[str, Any], after: dict[str, Any], values: dict[str, Any]
) -> int:
    """`unverified_count` once a move is written, derived rather than adjusted by each move:
    the staged instances outside the verified set, plus the gate's unverified workers outside
    the staged sets (whatever the row counted before the move; nothing else writes a staged
    gate's count, the drift reconciler leaves gates with an active refresh alone)."""
    staged_before = set().union(*(before[name] for name in _STAGED_SETS))
    outside = max(0, gate.unverified_count - len(staged_before - set(gate.verified_instances)))
    staged_after = set().union(*(after[name] for name in _STAGED_SETS))
    verified_after = set(values.get("verified_instances", gate.verified_instances))
    return outside + len(staged_after - verified_after)


def _ids(values) -> list[str]:
    return sorted(set(values), key=int)


def begin_staged(refresh, *, actor: Actor, reason: str, waves: int) -> None:
    """Take the refresh's gates without closing them: each keeps its state and verified set
    (the instances still serving the old version) and names the refresh."""
    gates = [gate_for(refresh.source, ns) for ns in refresh.namespaces]
    per_gate = {
        g.pk: {
            "instance_sets": {
                **_sets_of(g),
                "refresh_id": refresh.pk,
                "from_version": g.verified_version,
                "to_version": refresh.weight_version,
                "wave": 0,
                "waves": waves,
                "serving_old": _ids(g.verified_instances),
            }
            if (g.instance_sets or {}).get("refresh_id") != refresh.pk
            else g.instance_sets
        }
        for g in gates
    }
    _change(
        gates,
        AuditAction.GATE_STAGED,
        actor=actor,
        refresh=refresh,
        note=reason,
        per_gate=per_gate,
        reason=reason,
        active_refresh=refresh,
    )


def _move_instances(
    refresh,
    instances: Mapping[str, Sequence[str]],
    change: Callable[[Gate, set[str], dict[str, Any]], dict[str, Any]],
    *,
    action: AuditAction | None = None,
) -> None:
    """Move instance ids between a staged refresh's sets, one namespace per gate.

    `change(gate, ids, sets)` edits `sets` (the gate's `instance_sets`, lists copied) and
    returns the other columns to write. The gates are read with their rows locked and written
    in the same transaction, so a concurrent writer of the same gate (a quarantine admitting
    a worker, say) is never overwritten with what was read before it.
    """
    with transaction.atomic():
        for namespace in instances:
            gate_for(refresh.source, namespace)  # the gate exists before its row is locked
        lockorder.domain_lock("gates")
        gates = list(
            Gate.objects.select_for_update(no_key=True, of=("self",))
            .filter(source=refresh.source, namespace__in=list(instances))
            .order_by("pk")
        )
        ids = [g.pk for g in gates]
        _update(ids)
        for g in gates:
            before = _sets_of(g)
            sets = _sets_of(g)
            values = change(g, set(instances[g.namespace]), sets)
            values["unverified_count"] = _unverified_after(g, before, sets, values)
            Gate.objects.filter(pk=g.pk).update(instance_sets=sets, **values)
        fresh = list(Gate.objects.filter(pk__in=ids).select_related("source"))
        if action is not None:
            for gate in fresh:
                record(
                    action,
                    actor=Actor.system("policy-refresh executor"),
                    target=gate,
                    details={
                        "namespace": gate.namespace,
                        "state": gate.state,
                        "refresh_id": gate.active_refresh_id,
                        "verified_version": gate.verified_version,
                        "instance_sets": gate.instance_sets,
                    },
                )
    _announce(fresh)


def stage_wave(refresh, wave: int, instances: Mapping[str, Sequence[str]], *, reason: str) -> None:
    """Wave `wave` is about to be paused: its instances leave the verified set (trainers stop
    sending them rollouts before they stop serving) and are listed in flight."""

    def change(g: Gate, ids: set[str], sets: dict[str, Any]) -> dict[str, Any]:
        sets["wave"] = wave
        sets["serving_old"] = _ids(set(sets["serving_old"]) - ids)
        sets["in_flight"] = _ids(set(sets["in_flight"]) | ids)
        return {
            "verified_instances": [i for i in g.verified_instances if i not in ids],
            "reason": reason,
        }

    _move_instances(refresh, instances, change)


def wave_verified(
    refresh, verified: Mapping[str, Sequence[str]], *, admit: bool, reason: str
) -> None:
    """A wave passed verify: its instances move from in flight to the new version's set. With
    `admit` (the strategy's `admit_as_verified`) the gate moves to the new version at once for
    every instance verified so far; otherwise it keeps admitting the old set until the end."""

    def change(g: Gate, ids: set[str], sets: dict[str, Any]) -> dict[str, Any]:
        sets["in_flight"] = _ids(set(sets["in_flight"]) - ids)
        sets["verified_new"] = _ids(set(sets["verified_new"]) | ids)
        if not admit:
            return {"reason": reason}
        return {
            "reason": reason,
            "verified_version": refresh.weight_version,
            "verified_policy": refresh.target,
            "verified_instances": sets["verified_new"],
            "confirmed_at": timezone.now(),
        }

    _move_instances(refresh, verified, change, action=AuditAction.GATE_WAVE_VERIFIED)


def wave_left_out(refresh, left_out: Mapping[str, Sequence[str]], *, reason: str) -> None:
    """Workers the failure budget leaves out: no longer in flight, listed as left out."""

    def change(g: Gate, ids: set[str], sets: dict[str, Any]) -> dict[str, Any]:
        sets["in_flight"] = _ids(set(sets["in_flight"]) - ids)
        sets["serving_old"] = _ids(set(sets["serving_old"]) - ids)
        sets["left_out"] = _ids(set(sets["left_out"]) | ids)
        return {
            "verified_instances": [i for i in g.verified_instances if i not in ids],
            "reason": reason,
        }

    _move_instances(refresh, left_out, change)


def canary_rolled_back(refresh, back: Mapping[str, Sequence[str]], *, reason: str) -> None:
    """Canary workers verified back at the old version rejoin the old set (and the verified
    set, where the gate still stands for the old version)."""

    def change(g: Gate, ids: set[str], sets: dict[str, Any]) -> dict[str, Any]:
        sets["in_flight"] = _ids(set(sets["in_flight"]) - ids)
        sets["verified_new"] = _ids(set(sets["verified_new"]) - ids)
        sets["serving_old"] = _ids(set(sets["serving_old"]) | ids)
        if g.verified_version != sets.get("from_version"):
            return {"reason": reason}
        return {"reason": reason, "verified_instances": _ids(set(g.verified_instances) | ids)}

    _move_instances(refresh, back, change)


def left_out_entries(gate: Gate) -> list[dict[str, Any]]:
    """The drift entries of workers a refresh's failure budget left out (with their reason)."""
    return [d for d in gate.drift if d.get("kind") == LEFT_OUT_KIND]


#: The drift kind of a worker left out by a refresh's failure budget (quarantined).
LEFT_OUT_KIND = "left_out"


def release_instances(refresh, namespaces: Sequence[str], *, reason: str) -> None:
    """A refresh of named instances ends where the gate stands for another version: the gate
    keeps its state, version and verified set (the instances that kept serving it) and stops
    naming the refresh; `reason` says where the refreshed instances are."""
    gates = [gate_for(refresh.source, ns) for ns in sorted(namespaces)]
    _change(
        gates,
        AuditAction.GATE_RECONCILED,
        actor=Actor.system("policy-refresh executor"),
        refresh=refresh,
        note=reason,
        reason=reason,
        active_refresh=None,
        instance_sets={},
    )
