"""Gate reads and writes, and the release of a refresh's scope.

Every gate change bumps `revision`, is audited and published (`refresh.live`); a change of
state is also notified (`gate.opened`, `gate.closed`, `gate.unknown`: one notification per
source and change, listing its gates; `gate.force_reopened` is sent by the action itself).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NotRequired, TypedDict, cast

from django.db import DatabaseError, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from controlplane import dbretry, lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.jsontypes import WeightVersion
from controlplane.notify.emit import notify
from controlplane.refresh import gate_cache, ledger
from controlplane.refresh.ledger import Readback
from controlplane.refresh.live import publish_gate_changes
from controlplane.refresh.models import (
    ADMITTING_STATES,
    LEDGER_STATES,
    Admission,
    Closure,
    Evidence,
    Gate,
    GateState,
    ScopeLock,
    Serving,
    ServingInterval,
)
from controlplane.textlimits import LABEL_CHARS, REASON_CHARS

logger = logging.getLogger(__name__)


def gate_for(source, namespace: str) -> Gate:
    lockorder.domain_lock("gates")
    gate, _ = Gate.objects.get_or_create(source=source, namespace=namespace)
    return gate


@transaction.atomic
def ensure_gates(source, seen: Mapping[str, Sequence[tuple[str, str, Any]]], *, run=None) -> None:
    """Discovery saw these namespaces (`{namespace: [(instance id, key, declared version)]}`):
    each gets its gate, `unverified` until a refresh verifies it, so trainers reading the API,
    the gate stream or the pages learn it admits nothing. The ledger records the workers of an
    unverified gate as reported (version as declared, not admitted)."""
    lockorder.domain_lock("gates")
    existing = {
        g.namespace: g for g in Gate.objects.filter(source=source, namespace__in=list(seen))
    }
    created = [
        Gate.objects.create(source=source, namespace=ns)
        for ns in sorted(seen)
        if ns not in existing
    ]
    unverified = [*created, *(g for g in existing.values() if g.state == GateState.UNVERIFIED)]
    facts: dict[tuple[str, str], ledger.Change] = {}
    for gate in unverified:
        for instance_id, key, version in seen[gate.namespace]:
            facts[(gate.namespace, instance_id)] = ledger.reported(version, key=key)
    appended = ledger.write(source, facts, cause="seen by discovery", run=run)
    touched = created if not appended else unverified
    if touched:
        _update([g.pk for g in touched])
        project([g.pk for g in touched])
        _announce(
            list(Gate.objects.filter(pk__in=[g.pk for g in touched]).select_related("source"))
        )


def gate_state(source, namespace: str) -> dict[str, Any]:
    """What trainers and rollout frameworks read: is the namespace open, at which version."""
    gate = Gate.objects.filter(source=source, namespace=namespace).select_related("source").first()
    if gate is None:
        # Never refreshed: nothing was ever verified here, so nothing is admitted.
        return {
            "source": source.name,
            "source_id": source.pk,
            "namespace": namespace,
            "state": GateState.UNVERIFIED.value,
            "open": False,
            "since": None,
            "reason": NEVER_VERIFIED,
            "closure": "",
            "forced": None,
            "version": None,
            "versions": [],
            "admitted": [],
            "admitted_count": 0,
            "disagreements": [],
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


#: Why an unverified gate admits nothing.
NEVER_VERIFIED = "never verified: no policy refresh has verified this namespace yet"


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
    if gate.state == GateState.UNVERIFIED and not gate.reason:
        return NEVER_VERIFIED
    return gate.reason


def versions_served(admitted: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The versions the admitted instances serve, with counts (most served first)."""
    counts: dict[str, dict[str, Any]] = {}
    for entry in admitted:
        row = counts.setdefault(
            _vkey(entry["version"]), {"version": entry["version"], "count": 0, "verified": 0}
        )
        row["count"] += 1
        row["verified"] += 1 if entry.get("verified") else 0
    return sorted(counts.values(), key=lambda r: (-r["count"], _vkey(r["version"])))


def serialize_gate(gate: Gate) -> dict[str, Any]:
    admitted = list(gate.admitted or [])
    versions = versions_served(admitted) if gate.is_open else []
    forced = None
    if gate.state == GateState.OPEN_FORCED:
        unverified = [
            {"instance_id": e["instance_id"], "key": e["key"], "version": e["version"]}
            for e in admitted
            if not e.get("verified")
        ]
        forced = {
            "by": gate.forced_by,
            "at": _iso(gate.forced_at),
            "reason": gate.reason,
            "instances": unverified,
        }
    # Admitted instances serving another version than the one the gate was last verified at
    # (a force-reopen admitted what they serve): shown, never reversed by drift. A refresh to
    # either version, or a rollback, resolves it.
    disagreements = [
        {"instance_id": e["instance_id"], "key": e["key"], "version": e["version"]}
        for e in admitted
        if gate.verified_policy is not None and _vkey(e["version"]) != _vkey(gate.verified_version)
    ]
    return {
        "source": gate.source.name,
        "source_id": gate.source_id,
        "namespace": gate.namespace,
        "state": gate.state,
        "open": gate.is_open,
        "since": _iso(gate.since),
        "reason": displayed_reason(gate),
        "closure": gate.closure if gate.state == GateState.CLOSED else "",
        "forced": forced,
        # The version every admitted instance serves; null when none or several (open_mixed).
        "version": versions[0]["version"] if len(versions) == 1 else None,
        "versions": versions,
        "admitted": admitted if gate.is_open else [],
        "admitted_count": len(admitted) if gate.is_open else 0,
        "disagreements": disagreements if gate.is_open else [],
        # Deprecated, derived from `admitted` (docs/integrate/gates.md): the admitted instances
        # verified at the version the namespace was last verified at.
        "verified_version": gate.verified_version,
        "verified_instances": list(gate.verified_instances),
        "verified_count": len(gate.verified_instances),
        "unverified_count": gate.unverified_count,
        "confirmed_at": _iso(gate.confirmed_at),
        "drift": list(gate.drift),
        "drift_count": len(gate.drift),
        # A staged refresh (waves, canary) in progress: which instances are on which version.
        "instance_sets": staged_header(gate),
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
    Registered before the push, so a client woken by it reads the new state.

    A transaction often registers the same gates several times (`_update`, then `_announce`;
    a refresh step touching many namespaces): the ids gather in one set per connection, and
    the first of the transaction's callbacks to run copies them all with one read, the others
    finding nothing left. A callback dropped with a rolled-back savepoint leaves its ids to
    the others (or to the next commit): copying a gate's committed row once more is always
    correct, so an id is never lost, only at worst copied again."""
    ids = list(ids)
    if not ids:
        return
    pending = _pending_copies()
    pending.update(ids)
    transaction.on_commit(_copy_pending)


def _pending_copies() -> set[int]:
    # Per connection, so per thread: a transaction's callbacks run on its own connection.
    connection = transaction.get_connection()
    pending: set[int] | None = getattr(connection, "_gate_copies_pending", None)
    if pending is None:
        pending = connection._gate_copies_pending = set()
    return pending


def _copy_pending() -> None:
    """Copy the pending gates. Runs after the commit, so it never raises: the callbacks after
    it (the live push) still run, and the committed unit is not reported as failed. A read the
    database refuses leaves the ids pending for the next commit; meanwhile the gate API, which
    checks every copy's revision against the row, answers from the row."""
    pending = _pending_copies()
    if not pending:
        return
    ids = list(pending)
    try:
        rows = list(Gate.objects.filter(pk__in=ids).select_related("source"))
    except DatabaseError:
        logger.warning(
            "gate copies %s not read after commit; left for the next", ids, exc_info=True
        )
        if not dbretry.in_transaction():
            # The connection is gone: the caller's next statement gets a fresh one.
            dbretry.reconnect()
        return
    pending.difference_update(ids)
    gate_cache.store(serialize_gate(g) for g in rows)


def _announce(gates: list[Gate]) -> None:
    """Push the gates' new state once committed (after their copies: `_copy_on_commit`)."""
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


# -- the projection: gates from the serving ledger --------------------------------------------


def project(ids, *, lift: bool = False, now=None) -> None:
    """Recompute the gates `ids` from the serving ledger, in the caller's transaction.

    The one function that writes a gate's derived fields (`models.Gate`). A closed or unknown
    gate keeps its state (a closure is the gate's own fact) unless `lift` (the closure ends
    now: a reopen); every other gate takes the state the ledger says."""
    gates = list(Gate.objects.filter(pk__in=list(ids)))
    if not gates:
        return
    now = now or timezone.now()
    rows: dict[tuple[int, str], list[ServingInterval]] = defaultdict(list)
    for row in ServingInterval.objects.filter(
        source_id__in={g.source_id for g in gates},
        namespace__in={g.namespace for g in gates},
        valid_to__isnull=True,
    ):
        rows[(row.source_id, row.namespace)].append(row)
    for gate in gates:
        values = derive(gate, rows[(gate.source_id, gate.namespace)], lift=lift)
        if values["state"] != gate.state:
            values["since"] = now
        Gate.objects.filter(pk=gate.pk).update(**values)


def _vkey(version: Any) -> str:
    return json.dumps(version, sort_keys=True)


def derive(gate: Gate, rows: Sequence[ServingInterval], *, lift: bool = False) -> dict[str, Any]:
    """A gate's derived fields from its namespace's current ledger intervals (pure)."""
    live = [r for r in rows if r.serving != Serving.DEPARTED]
    admitted = sorted((r for r in live if r.admitted), key=lambda r: int(r.instance_id))
    verified_version = (gate.verified_policy or {}).get("weight_version")
    if gate.verified_policy is None:
        verified_version = gate.verified_version  # a gate verified before the ledger existed
    unverified = [r for r in admitted if not r.verified]
    versions = {_vkey(r.version) for r in admitted if r.verified}
    state = gate.state
    if lift or gate.state in LEDGER_STATES:
        if unverified or gate.forced_by:
            # a person opened it: forced until a verified opening or a closure
            state = GateState.OPEN_FORCED
        elif not admitted:
            verified_ever = gate.verified_policy is not None or gate.verified_version is not None
            state = GateState.OPEN if verified_ever else GateState.UNVERIFIED
        elif len(versions) > 1:
            state = GateState.OPEN_MIXED
        else:
            state = GateState.OPEN
    verified_ids = [
        r.instance_id
        for r in admitted
        if r.verified and _vkey(r.version) == _vkey(verified_version)
    ]
    return {
        "state": state,
        "verified_version": verified_version,
        "verified_instances": verified_ids,
        "unverified_count": len(live) - len(verified_ids),
        "admitted": [_admitted_entry(r) for r in admitted],
        "instance_sets": _staged_sets(gate, live),
    }


class ForcedAdmission(TypedDict):
    """Who admitted an instance unverified (a force-reopen), when (ISO) and why."""

    by: str
    at: str | None
    reason: str


class AdmittedEntry(TypedDict):
    """One entry of `Gate.admitted` (`_admitted_entry`): an instance the gate takes in, derived
    from its ledger interval. This module owns the keys of the gate's JSON columns."""

    instance_id: str
    key: str
    version: WeightVersion
    #: The ledger's `Evidence` and `Admission` values.
    evidence: str
    verified: bool
    admission: str
    refresh_id: int | None
    quarantine_id: int | None
    #: ISO time the interval began.
    since: str | None
    forced: ForcedAdmission | None


class DriftEntry(TypedDict):
    """One entry of `Gate.drift`: an instance that drifted from the verified set (`drift.py`),
    or that a refresh's failure budget left out (`executor/budget.py`)."""

    key: str
    instance_id: str
    #: What happened: joined, version, left_out, ... (`drift.py`, `budget.KIND`).
    kind: str
    detail: str
    #: Its quarantine's state (or the budget's joined state).
    state: str
    quarantine_id: NotRequired[int]


def _admitted_entry(r: ServingInterval) -> AdmittedEntry:
    return {
        "instance_id": r.instance_id,
        "key": r.key,
        "version": r.version,
        "evidence": r.evidence,
        "verified": r.verified,
        "admission": r.admission,
        "refresh_id": r.refresh_id,
        "quarantine_id": r.quarantine_id,
        "since": _iso(r.valid_from),
        "forced": (
            {"by": r.forced_by, "at": _iso(r.forced_at), "reason": r.forced_reason}
            if r.admission == Admission.FORCED
            else None
        ),
    }


class StagedHeader(TypedDict, total=False):
    """`Gate.instance_sets` as stored: the staged refresh that owns the gate (its lists are
    derived from the ledger, see `InstanceSets`). This module owns the column's keys."""

    refresh_id: int
    from_version: Any
    to_version: Any
    #: The wave being run (0 before the first) and how many the plan has.
    wave: int
    waves: int


class InstanceSets(StagedHeader, total=False):
    """The header with which instances are on which version (`_staged_sets`)."""

    serving_old: list[str]
    in_flight: list[str]
    verified_new: list[str]
    left_out: list[str]


#: The header's keys, each present (None when unknown) in what `_staged_sets` returns.
_STAGED_HEADER = tuple(StagedHeader.__annotations__)


def staged_header(gate: Gate) -> StagedHeader:
    """A copy of the gate's stored `instance_sets` (empty when no staged refresh owns it)."""
    return cast(StagedHeader, dict(gate.instance_sets or {}))


def _staged_sets(gate: Gate, live: Sequence[ServingInterval]) -> dict[str, Any]:
    """While a staged refresh (waves, canary) owns the gate: which instances are on which
    version, from the ledger. `serving_old`: admitted at the old version and untouched;
    `in_flight`: paused by the refresh; `verified_new`: verified by it at the new version;
    `left_out`: left out by its failure budget."""
    stored = staged_header(gate)
    header = {k: stored.get(k) for k in _STAGED_HEADER}
    refresh_id = header["refresh_id"]
    if refresh_id is None or refresh_id != gate.active_refresh_id:
        return {}
    to_version = _vkey(header["to_version"])
    from_version = _vkey(header["from_version"])
    sets: dict[str, list[str]] = {name: [] for name in _STAGED_SETS}
    for r in live:
        moving = r.transition_refresh_id == refresh_id
        if moving and r.serving == Serving.PAUSED:
            sets["in_flight"].append(r.instance_id)
        elif moving and r.serving == Serving.QUARANTINED:
            sets["left_out"].append(r.instance_id)
        elif (
            r.refresh_id == refresh_id
            and r.evidence == Evidence.VERIFIED_REFRESH
            and _vkey(r.version) == to_version
        ):
            sets["verified_new"].append(r.instance_id)
        elif r.admitted and _vkey(r.version) == from_version:
            sets["serving_old"].append(r.instance_id)
    return {**header, **{name: _ids(ids) for name, ids in sets.items()}}


def _withdraw_all(source, namespaces: Sequence[str], *, cause: str, transition=None) -> None:
    """Every admitted instance of these namespaces stops being admitted (its gate closed)."""
    rows = ledger.current(source, namespaces)
    facts = {
        (r.namespace, r.instance_id): ledger.withdrawn(transition=transition)
        for r in rows
        if r.admission
    }
    ledger.write(source, facts, cause=cause, known=rows)


def _change(
    gates: list[Gate],
    action: AuditAction,
    *,
    actor: Actor,
    refresh,
    note: str = "",
    state: str | None = None,
    per_gate: Mapping[int, Mapping[str, Any]] | None = None,
    facts: Callable[[], Any] | None = None,
    lift: bool = False,
    **fields,
) -> list[Gate]:
    """Change gates: their own fields (`state` for a closure, `fields`, `per_gate`), then the
    ledger `facts`, then the projection, then audit, notifications and the push."""
    ids = [g.pk for g in gates]
    before = {g.pk: g.state for g in gates}
    now = timezone.now()
    _update(ids, state=state, now=now, **fields)
    for gate_id, values in (per_gate or {}).items():
        Gate.objects.filter(pk=gate_id).update(**values)
    if facts is not None:
        facts()
    project(ids, lift=lift, now=now)
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
                "admitted_count": len(gate.admitted),
                "reason": note or gate.reason,
            },
            correlation_id=refresh.correlation_id if refresh else None,
        )
    if action != AuditAction.GATE_FORCE_REOPENED:  # the force-reopen action notifies itself
        _notify_state_changes(before, fresh, refresh=refresh, reason=note)
    # Inside a transaction the copies `_update` registered and these are made once, at the
    # commit; in autocommit `_update` wrote them at once, before the projection, and these
    # write them again as projected.
    _announce(fresh)
    return fresh


#: The notification sent when a gate enters a state. `open_forced` is only entered through
#: the force-reopen action (which sends `gate.force_reopened`) or by returning from `unknown`.
_STATE_EVENTS = {
    GateState.OPEN: "gate.opened",
    GateState.OPEN_MIXED: "gate.opened",
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
        event = _STATE_EVENTS.get(GateState(gate.state))
        if before.get(gate.pk) != gate.state and event is not None:
            # open <-> open_mixed is one admission, seen differently: not a new opening
            if before.get(gate.pk) in ADMITTING_STATES and gate.state in ADMITTING_STATES:
                continue
            changed.setdefault(event, []).append(gate)
    for event, gates in changed.items():
        notify(event, source=gates[0].source, refresh=refresh, gates=gates, reason=reason)


#: A closure or a verified opening ends a person's force-reopen (`forced_by`, `forced_at`).
_NOT_FORCED: dict[str, Any] = {"forced_by": "", "forced_at": None}


def close_gates(refresh, *, actor: Actor, reason: str) -> None:
    """The refresh closes its namespaces: no instance of them is admitted until a reopen."""
    gates = [gate_for(refresh.source, ns) for ns in refresh.namespaces]
    _change(
        gates,
        AuditAction.GATE_CLOSED,
        actor=actor,
        refresh=refresh,
        state=GateState.CLOSED,
        reason=reason,
        closure=Closure.REFRESH,
        **_NOT_FORCED,
        active_refresh=refresh,
        state_before_unknown="",
        facts=lambda: _withdraw_all(
            refresh.source,
            refresh.namespaces,
            cause=f"gate closed by policy refresh #{refresh.pk}",
            transition=refresh,
        ),
    )


def open_gates_verified(
    refresh,
    *,
    actor: Actor,
    verified: Mapping[str, Sequence[str]],
    serving: Mapping[str, Sequence[str]] | None = None,
    namespaces: Sequence[str] | None = None,
    left_out: Mapping[str, Sequence[DriftEntry]] | None = None,
) -> None:
    """Open the refresh's gates at its version for exactly the instances verified at it.

    `verified` maps each namespace to the instance ids (decimal strings) verified at the
    refresh's version: the ledger records them verified and admitted, and every other instance
    of the namespace not admitted. `serving` lists the live instance ids per namespace (those
    the ledger does not know yet are recorded, unverified; those it knows that are not listed
    have departed); None: as the ledger knows them. `namespaces` opens only those (a refresh
    resolved namespace by namespace); default: all. `left_out` lists per namespace the drift
    entries of workers the failure budget left out (kind `left_out`, quarantined).
    """
    namespaces = refresh.namespaces if namespaces is None else namespaces
    gates = [gate_for(refresh.source, ns) for ns in sorted(namespaces)]
    left_out = left_out or {}
    per_gate = {g.pk: {"drift": list(left_out.get(g.namespace, []))} for g in gates}

    def facts() -> None:
        version = refresh.weight_version
        changes: dict[tuple[str, str], ledger.Change] = {}
        # One read of the namespaces' intervals, for the facts and for the write.
        known = ledger.current(refresh.source, namespaces)
        by_namespace: dict[str, list] = {}
        for row in known:
            by_namespace.setdefault(row.namespace, []).append(row)
        for namespace in namespaces:
            ids = set(verified.get(namespace, ()))
            out = {str(d.get("instance_id")) for d in left_out.get(namespace, [])}
            live = None if serving is None else set(serving.get(namespace, ()))
            for row in by_namespace.get(namespace, ()):
                if row.instance_id in ids:
                    continue
                if row.instance_id in out:
                    change = ledger.withdrawn(serving=Serving.QUARANTINED, transition=_CLEAR)
                elif live is not None and row.instance_id not in live:
                    change = ledger.departed()
                else:
                    change = ledger.withdrawn(serving=Serving.SERVING, transition=_CLEAR)
                changes[(namespace, row.instance_id)] = change
            for instance_id in sorted(live or ()):
                if instance_id not in ids:
                    changes.setdefault((namespace, instance_id), ledger.seen())
            for instance_id in ids:
                changes[(namespace, instance_id)] = ledger.verified(refresh, version, admitted=True)
        proved = [(ns, iid) for ns in namespaces for iid in verified.get(ns, ())]
        ledger.write(
            refresh.source,
            changes,
            cause=f"policy refresh #{refresh.pk} reopened",
            journal=ledger.refresh_journal(refresh, proved),
            known=known,
        )

    _change(
        gates,
        AuditAction.GATE_OPENED,
        actor=actor,
        refresh=refresh,
        per_gate=per_gate,
        facts=facts,
        lift=True,
        reason="",
        closure="",
        **_NOT_FORCED,
        active_refresh=None,
        verified_policy=refresh.target,
        confirmed_at=timezone.now(),
        instance_sets={},
        state_before_unknown="",
    )


#: `ledger.withdrawn(transition=_CLEAR)`: the refresh that moved the instance is done with it.
_CLEAR = ledger.CLEAR


def update_gate_reason(refresh, reason: str) -> None:
    """A held/aborted refresh explains why the gate is still closed (not a separate audit).

    Only the gates the refresh still holds: a namespace resolved on its own (force-reopened,
    reopened verified) keeps its own state and reason."""
    gates = Gate.objects.filter(active_refresh=refresh)
    _update(list(gates.values_list("pk", flat=True)), reason=reason)
    _announce(list(gates.select_related("source")))


def force_open(
    gates: list[Gate],
    *,
    actor: Actor,
    refresh,
    reason: str,
    readbacks: Mapping[str, Sequence[Readback]] | None = None,
    run=None,
) -> None:
    """Opened by a person without verification, for what the workers actually serve.

    `readbacks` lists per namespace every live instance with the version its readback reports:
    each is admitted, forced, at that version (never at a version nobody serves); the ledger's
    instances not listed have departed. None: no readback, every instance the ledger knows
    serving is admitted at the version and evidence it has there. Never shown like a verified
    `open`: the gate stays `open_forced` until a verified opening or a closure."""
    at = timezone.now()

    def known(gate: Gate) -> list[Readback]:
        return [
            Readback(r.instance_id, r.key, r.version, r.evidence)
            for r in ledger.current(gate.source, [gate.namespace])
            if r.serving != Serving.DEPARTED
        ]

    def facts() -> None:
        for gate in gates:
            given = known(gate) if readbacks is None else readbacks.get(gate.namespace, ())
            listed = {rb.instance_id: rb for rb in given}
            changes: dict[tuple[str, str], ledger.Change] = {
                (gate.namespace, row.instance_id): ledger.departed()
                for row in ledger.current(gate.source, [gate.namespace])
                if row.instance_id not in listed
            }
            for rb in listed.values():
                changes[(gate.namespace, rb.instance_id)] = ledger.forced(
                    rb.version,
                    key=rb.key,
                    by=actor.label,
                    at=at,
                    reason=reason,
                    evidence=rb.evidence,
                )
            ledger.write(gate.source, changes, cause=f"force-reopened by {actor.label}", run=run)

    _change(
        gates,
        AuditAction.GATE_FORCE_REOPENED,
        actor=actor,
        refresh=refresh,
        note=reason,
        facts=facts,
        lift=True,
        reason=reason,
        closure="",
        forced_by=actor.label[:LABEL_CHARS],
        forced_at=at,
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
    project([g.pk for g in gates])  # the ledger may have moved while nobody could see it
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
    """The refresh ended: gates stop naming it. A closed gate keeps saying why it is closed.

    The instances it paused are serving again. Those it moved without verifying stay "in
    transition" in the ledger (old version or its target: nobody read them back) until a
    later fact (a readback at force-reopen, a refresh, a catch-up) says which."""
    lockorder.domain_lock("gates")
    closed = Gate.objects.filter(active_refresh=refresh, state=GateState.CLOSED)
    if reason:
        _update(list(closed.values_list("pk", flat=True)), reason=reason)
    touched = list(Gate.objects.filter(active_refresh=refresh).select_related("source"))
    if not touched:
        return
    Gate.objects.filter(pk__in=[g.pk for g in touched]).update(active_refresh=None)
    paused = ServingInterval.objects.filter(
        source=refresh.source,
        valid_to__isnull=True,
        transition_refresh=refresh,
        serving=Serving.PAUSED,
    ).values_list("namespace", "instance_id")
    ledger.write(
        refresh.source,
        {key: ledger.withdrawn(serving=Serving.SERVING) for key in paused},
        cause=f"policy refresh #{refresh.pk} ended",
    )
    # A staged refresh's sets described its waves; drift reconciliation takes over from here.
    Gate.objects.filter(pk__in=[g.pk for g in touched]).update(instance_sets={})
    project([g.pk for g in touched])
    _announce(list(Gate.objects.filter(pk__in=[g.pk for g in touched]).select_related("source")))


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
    facts: ledger.Facts,
    drift: list[DriftEntry],
    new: Sequence[DriftEntry] = (),
    close_reason: str = "",
    run=None,
) -> Gate:
    """Write what one discovery found for a gate the caller holds locked (`locked_gate`).

    `facts` are the ledger facts it found (instances that departed, drifted, joined), `drift`
    the complete drift list, `new` the entries found this time (audited as drift) and
    `close_reason` set when the source's drift policy closes the gate. A discovery that changes
    nothing only moves `confirmed_at` (no revision, no push: trainers' ETags stay valid).
    """
    now = timezone.now()
    appended = ledger.write(gate.source, facts, cause="drift reconciliation", run=run, now=now)
    changes: dict[str, Any] = {}
    if drift != list(gate.drift):
        changes["drift"] = drift
    if not appended and not changes and not close_reason:
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
            closure=Closure.DRIFT,
            **_NOT_FORCED,
            confirmed_at=now,
            state_before_unknown="",
            facts=lambda: _withdraw_all(gate.source, [gate.namespace], cause=close_reason),
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


def lock_scope_gates(source, namespaces: Sequence[str]) -> list[Gate]:
    """Lock the gates of these namespaces, in namespace order (a refresh's start, after its
    scope locks: it orders the start against a quarantine's claim, which locks its gate)."""
    lockorder.domain_lock("gates")
    return list(
        Gate.objects.select_for_update(no_key=True, of=("self",))
        .filter(source=source, namespace__in=list(namespaces))
        .order_by("namespace")
    )


def drop_drift_entries(source, instances: Mapping[str, set[str]]) -> None:
    """A refresh took these drifted instances over (`executor/handover.py`): their entries
    leave the drift lists of their gates (`{namespace: {instance id}}`), locked in namespace
    order. Call inside the caller's transaction, before it locks any quarantine."""
    for gate in Gate.objects.filter(source=source, namespace__in=sorted(instances)).order_by(
        "namespace"
    ):
        locked = locked_gate(gate.pk)
        if locked is None:
            continue
        gone = instances[locked.namespace]
        drift = [d for d in locked.drift if d.get("instance_id") not in gone]
        if drift != list(locked.drift):
            _update([locked.pk], drift=drift)


@transaction.atomic
def close_for_drift(gate_id: int, *, actor: Actor, reason: str) -> None:
    """Drift the control plane could not contain (a worker that cannot be paused)."""
    gate = locked_gate(gate_id)
    if gate is None:
        return
    if gate.state == GateState.CLOSED:  # already closed: add the worker to the reason
        joined = f"{gate.reason}; {reason}" if gate.reason else reason
        _update([gate.pk], reason=joined[:REASON_CHARS])
        _announce(list(Gate.objects.filter(pk=gate.pk).select_related("source")))
        return
    close_gate(gate, actor=actor, closure=Closure.DRIFT, reason=reason)


def close_gate(gate: Gate, *, actor: Actor, closure: str, reason: str) -> Gate:
    """Close one gate for a reason that is not a refresh: the place for closing facts.

    `closure` names what closed it (`Closure`: drift, stale_policy, ...); every instance stops
    being admitted in the ledger, so version windows end here. A caller that holds no lock
    gets the gate row locked here. The exits: `lift_closure` (the condition cleared), a
    refresh, or a force-reopen."""
    locked = locked_gate(gate.pk) or gate
    return _change(
        [locked],
        AuditAction.GATE_CLOSED,
        actor=actor,
        refresh=None,
        note=reason,
        state=GateState.CLOSED,
        reason=reason,
        closure=closure,
        **_NOT_FORCED,
        state_before_unknown="",
        facts=lambda: _withdraw_all(locked.source, [locked.namespace], cause=reason),
    )[0]


def lift_closure(gate: Gate, *, actor: Actor, closure: str, note: str) -> Gate | None:
    """A closure of kind `closure` ends because its condition cleared. The instances whose
    last admission was withdrawn by that closure are admitted again as they were (verified or
    forced, at the same version); the ledger then decides the state. None when the gate is not
    closed for that kind (someone else closed or reopened it meanwhile)."""
    locked = locked_gate(gate.pk)
    if locked is None or locked.state != GateState.CLOSED or locked.closure != closure:
        return None

    def facts() -> None:
        previous = _last_admissions(locked)
        ledger.write(
            locked.source,
            {(locked.namespace, iid): ledger.readmitted(row) for iid, row in previous.items()},
            cause=note,
        )

    return _change(
        [locked],
        AuditAction.GATE_OPENED,
        actor=actor,
        refresh=None,
        note=note,
        facts=facts,
        lift=True,
        reason="",
        closure="",
    )[0]


def _last_admissions(gate: Gate) -> dict[str, ServingInterval]:
    """Per instance still serving, its last admitted interval, if that ended when the gate
    last closed (`since`) and nothing changed what it serves afterwards."""
    current = {
        r.instance_id: r
        for r in ledger.current(gate.source, [gate.namespace])
        if r.serving == Serving.SERVING and not r.admission
    }
    ended = ServingInterval.objects.filter(
        source=gate.source,
        namespace=gate.namespace,
        instance_id__in=list(current),
        valid_to__gte=gate.since,
    ).exclude(admission="")
    out: dict[str, ServingInterval] = {}
    for row in ended.order_by("valid_to"):
        now = current[row.instance_id]
        if now.version == row.version and now.evidence == row.evidence:
            out[row.instance_id] = row
    return out


@transaction.atomic
def admit_instance(
    gate_id: int, instance_id: str, *, version: Any, actor: Actor, note: str, quarantine
) -> bool:
    """A caught-up worker is admitted again, verified by its catch-up, if the gate still
    stands for `version` (its `verified_policy`).

    False (nothing written) when the gate has moved to another version since the drift was
    found: the worker was verified at a policy the gate no longer stands for.
    """
    gate = locked_gate(gate_id)
    if gate is None or gate.verified_version != version:
        return False
    drift = [d for d in gate.drift if d.get("instance_id") != instance_id]

    def facts() -> None:
        change = ledger.caught_up(quarantine, version)
        where = (gate.namespace, instance_id)
        journal = {where: ledger.catch_up_journal(quarantine)}
        ledger.write(gate.source, {where: change}, cause=note, journal=journal)

    _change(
        [gate],
        AuditAction.GATE_INSTANCE_ADMITTED,
        actor=actor,
        refresh=None,
        note=note,
        facts=facts,
        drift=drift,
    )
    return True


@transaction.atomic
def instance_released(gate_id: int, instance_id: str, *, version: Any, key: str) -> None:
    """A quarantined worker was resumed without admission: it serves `version` (its readback
    said so) outside its gate."""
    gate = locked_gate(gate_id)
    if gate is None:
        return
    ledger.write(
        gate.source,
        {(gate.namespace, instance_id): ledger.reported(version, key=key)},
        cause=f"{key} released from quarantine, not admitted",
    )
    _update([gate.pk])
    project([gate.pk])
    _announce(list(Gate.objects.filter(pk=gate.pk).select_related("source")))


@transaction.atomic
def forget_drift(gate_id: int, instance_id: str) -> None:
    """The drifted instance is gone (dropped): its entry leaves the gate's drift list."""
    gate = locked_gate(gate_id)
    if gate is None:
        return
    drift = [d for d in gate.drift if d.get("instance_id") != instance_id]
    if drift != gate.drift:
        _update([gate.pk], drift=drift)
        ledger.write(
            gate.source,
            {(gate.namespace, instance_id): ledger.departed()},
            cause="dropped: left the fleet",
        )
        project([gate.pk])
        _announce(list(Gate.objects.filter(pk=gate.pk).select_related("source")))


# -- staged refreshes (refresh/strategy.py): waves and canaries -------------------------------
# While a staged refresh runs its gates are not closed: they keep admitting the old version for
# exactly the instances still serving it, and `instance_sets` says which instances are on which
# version. The executor calls these inside its fenced transaction.


#: A staged refresh's instance sets (`Gate.instance_sets`), derived from the ledger.
_STAGED_SETS = ("serving_old", "in_flight", "verified_new", "left_out")


def _ids(values) -> list[str]:
    return sorted(set(values), key=int)


def begin_staged(refresh, *, actor: Actor, reason: str, waves: int) -> None:
    """Take the refresh's gates without closing them: each keeps its state and admitted set
    (the instances still serving the old version) and names the refresh."""
    gates = [gate_for(refresh.source, ns) for ns in refresh.namespaces]
    per_gate = {
        g.pk: {
            "instance_sets": StagedHeader(
                refresh_id=refresh.pk,
                from_version=g.verified_version,
                to_version=refresh.weight_version,
                wave=0,
                waves=waves,
            )
        }
        for g in gates
        if staged_header(g).get("refresh_id") != refresh.pk
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
    change: Callable[[Gate, set[str]], tuple[ledger.Change, dict[str, Any]]],
    *,
    action: AuditAction | None = None,
    cause: str,
    proved: bool = False,
) -> None:
    """Record a staged refresh's facts about some instances, one namespace per gate.

    `proved`: the facts are verifications by `refresh`, whose journal rows are recorded with
    them (`ledger.refresh_journal`).

    `change(gate, ids)` returns the ledger fact for each of `ids` and the gate's own columns to
    write (reason, wave, the version it stands for). The gates are locked and the projection
    runs in the same transaction, so a concurrent writer of the same gate (a quarantine
    admitting a worker, say) is never overwritten with what was read before it.
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
        facts: dict[tuple[str, str], ledger.Change] = {}
        for g in gates:
            fact, values = change(g, set(instances[g.namespace]))
            facts.update({(g.namespace, iid): fact for iid in instances[g.namespace]})
            if values:
                Gate.objects.filter(pk=g.pk).update(**values)
        journal = ledger.refresh_journal(refresh, facts) if proved else None
        ledger.write(refresh.source, facts, cause=cause, journal=journal)
        project(ids)
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


def _with_wave(g: Gate, wave: int) -> dict[str, Any]:
    header = staged_header(g)
    header["wave"] = wave
    return {"instance_sets": header}


def stage_wave(refresh, wave: int, instances: Mapping[str, Sequence[str]], *, reason: str) -> None:
    """Wave `wave` is about to be paused: its instances stop being admitted (trainers stop
    sending them rollouts before they stop serving) and are in flight."""

    def change(g: Gate, ids: set[str]) -> tuple[ledger.Change, dict[str, Any]]:
        fact = ledger.withdrawn(serving=Serving.PAUSED, transition=refresh)
        return fact, {"reason": reason, **_with_wave(g, wave)}

    _move_instances(refresh, instances, change, cause=f"policy refresh #{refresh.pk} wave {wave}")


def wave_verified(
    refresh, verified: Mapping[str, Sequence[str]], *, admit: bool, reason: str
) -> None:
    """A wave passed verify: its instances are verified at the new version. With `admit` (the
    strategy's `admit_as_verified`) they are admitted at once and the gate stands for the new
    version (the old set stays admitted at the old one: `open_mixed`); otherwise they wait,
    unadmitted, for the end."""

    def change(g: Gate, ids: set[str]) -> tuple[ledger.Change, dict[str, Any]]:
        fact = ledger.verified(refresh, refresh.weight_version, admitted=admit)
        if not admit:
            return fact, {"reason": reason}
        return fact, {
            "reason": reason,
            "verified_policy": refresh.target,
            "confirmed_at": timezone.now(),
        }

    _move_instances(
        refresh,
        verified,
        change,
        action=AuditAction.GATE_WAVE_VERIFIED,
        cause=f"policy refresh #{refresh.pk} verified a wave",
        proved=True,
    )


def wave_left_out(refresh, left_out: Mapping[str, Sequence[str]], *, reason: str) -> None:
    """Workers the failure budget leaves out: not admitted, quarantined."""

    def change(g: Gate, ids: set[str]) -> tuple[ledger.Change, dict[str, Any]]:
        return ledger.withdrawn(serving=Serving.QUARANTINED, transition=refresh), {"reason": reason}

    _move_instances(refresh, left_out, change, cause=f"left out by policy refresh #{refresh.pk}")


def canary_rolled_back(refresh, back: Mapping[str, Sequence[str]], *, reason: str) -> None:
    """Canary workers verified back at the old version: admitted again where the gate still
    stands for the old version."""

    def change(g: Gate, ids: set[str]) -> tuple[ledger.Change, dict[str, Any]]:
        old = staged_header(g).get("from_version")
        same = json.dumps(g.verified_version, sort_keys=True) == json.dumps(old, sort_keys=True)
        return ledger.verified(refresh, old, admitted=same), {"reason": reason}

    _move_instances(
        refresh,
        back,
        change,
        cause=f"canary of policy refresh #{refresh.pk} rolled back",
        proved=True,
    )


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
