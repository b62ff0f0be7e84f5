"""Drift reconciliation: after every discovery, does each worker still match the ledger?

A gated namespace (a gate in an admitting state that a refresh verified) is compared worker by
worker with what the serving ledger says its gate admits:

- `joined`: a live instance id its gate does not admit (a new worker, or a restarted one: a
  restart registers a new instance id, on its base weights);
- `recovered`: the same, for a worker this discovery saw stop erroring;
- `version`: an admitted instance whose version readback is not the version the ledger admits
  it at (verified or forced: a person's force-reopen admitted what it serves, and only the
  worker moving away from that is drift). A force-reopen that could read nothing back admitted
  an `unknown` version: its first readback is recorded as what it serves, never drift (else
  drift would quietly turn the approver's admission back to the old version).

An instance that is gone is not drift: the ledger records it departed. Namespaces with an
active refresh are skipped (the refresh owns them), and so are instances an open quarantine
already owns. An admitted instance serving another version than the gate's verified policy
(force-reopened at what it serves) is not drift either: the gate shows the disagreement
(`disagreements`) and a person resolves it with a refresh or a rollback.

What drift does is the source's `drift_policy` (fleet.DriftPolicy): `quarantine` opens a
`Quarantine` per drifted worker and hands it to `refresh.quarantine` (pause at once, catch up
alone, admit back); `close` closes the gate naming the drift; `observe` only records it. Under
every policy a drifted worker stops being admitted (the ledger records what it reported).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.fleet.models import (
    DiscoveryRun,
    DriftPolicy,
    Source,
    Worker,
    WorkerEvent,
    WorkerEventKind,
    WorkerState,
)
from controlplane.notify.emit import notify
from controlplane.notify.models import NotificationEvent
from controlplane.refresh import gates, ledger
from controlplane.refresh.drill_history import drilled_instances
from controlplane.refresh.models import (
    ADMITTING_STATES,
    OPEN_QUARANTINE_STATES,
    Admission,
    Evidence,
    Gate,
    Quarantine,
    QuarantineState,
    ScopeLock,
    Serving,
    ServingInterval,
)

logger = logging.getLogger(__name__)

RECONCILER = Actor.system("drift reconciler")
JOINED, VERSION, RECOVERED = "joined", "version", "recovered"


@dataclass(frozen=True)
class Drifted:
    worker: Worker
    kind: str
    detail: str

    def entry(self, state: str) -> gates.DriftEntry:
        return {
            "key": self.worker.key,
            "instance_id": self.worker.instance_id,
            "kind": self.kind,
            "detail": self.detail,
            "state": state,
        }


def _readback_differs(worker: Worker, version) -> bool:
    """Only a current, declared readback counts: a failed probe keeps the last known version,
    which is not evidence of anything."""
    return (
        worker.version_probed_at is not None
        and not worker.version_error
        and worker.weight_version_declared
        and worker.weight_version != version
    )


def find_drift(
    gate: Gate,
    workers: list[Worker],
    owned: set[str],
    recovered_ids: set[int],
    admitted: dict[str, ServingInterval],
) -> list[Drifted]:
    """The drifted workers of one gate, given its admitted intervals by instance id; pure."""
    drifted: list[Drifted] = []
    for worker in workers:
        if worker.instance_id in owned or worker.state != WorkerState.LIVE:
            continue
        interval = admitted.get(worker.instance_id)
        if interval is None:
            kind = RECOVERED if worker.pk in recovered_ids else JOINED
            what = "stopped erroring" if kind == RECOVERED else "joined"
            detail = (
                f"{what} with version {worker.weight_version!r}, not admitted (gate verified "
                f"{gate.verified_version!r})"
            )
            drifted.append(Drifted(worker, kind, detail))
        elif interval.evidence == Evidence.UNKNOWN:
            # Force-reopened without a readback: the version recorded is the last one seen,
            # not a claim, so a first readback is evidence (`ledger.read_back`), not drift.
            continue
        elif _readback_differs(worker, interval.version):
            how = "forced" if interval.admission == Admission.FORCED else "verified"
            detail = f"reads back {worker.weight_version!r}, admitted {how} at {interval.version!r}"
            drifted.append(Drifted(worker, VERSION, detail))
    return drifted


def _declared(worker: Worker) -> Any:
    """The version a worker's last readback declared, or None when it declared none."""
    if worker.version_probed_at is None or worker.version_error:
        return None
    return worker.weight_version if worker.weight_version_declared else None


def _outcome_state(policy: str) -> str:
    states: dict[str, str] = {
        DriftPolicy.QUARANTINE: QuarantineState.QUARANTINED.value,
        DriftPolicy.CLOSE: "closed",
    }
    return states.get(policy, "observed")


def reconcile_source(source_id: int, run_id: int | None = None) -> list[int]:
    """Compare every gated namespace of the source with the latest discovery.

    Returns the ids of the quarantines opened (the caller enqueues their catch-up).
    """
    source = Source.objects.filter(pk=source_id).first()
    if source is None or source.stale:
        return []
    seen: dict[str, list[tuple[str, str, Any]]] = {}
    for worker in Worker.objects.filter(source=source, state=WorkerState.LIVE):
        seen.setdefault(worker.namespace, []).append(
            (worker.instance_id, worker.key, _declared(worker))
        )
    run = DiscoveryRun.objects.filter(pk=run_id).first() if run_id else None
    gates.ensure_gates(source, seen, run=run)
    candidates = list(
        Gate.objects.filter(
            source=source,
            state__in=ADMITTING_STATES,
            verified_policy__isnull=False,
            active_refresh__isnull=True,
        ).values_list("pk", "namespace")
    )
    locked = set(ScopeLock.objects.filter(source=source).values_list("namespace", flat=True))
    recovered_ids: set[int] = set()
    if run_id is not None:
        recovered_ids = set(
            WorkerEvent.objects.filter(
                run_id=run_id, kind=WorkerEventKind.STOPPED_ERRORING
            ).values_list("worker_id", flat=True)
        )
    opened: list[int] = []
    for gate_id, namespace in sorted(candidates, key=lambda c: c[1]):
        if namespace in locked:
            continue  # an active refresh owns this scope
        try:
            opened += _reconcile_gate(source, gate_id, recovered_ids, run_id)
        except IntegrityError:
            # A concurrent reconcile opened the same quarantine first; it owns the worker.
            logger.info("drift: %s/%s reconciled concurrently", source.name, namespace)
    return opened


@transaction.atomic
def _reconcile_gate(
    source: Source, gate_id: int, recovered_ids: set[int], run_id: int | None = None
) -> list[int]:
    gate = gates.locked_gate(gate_id)
    if (
        gate is None
        or gate.state not in ADMITTING_STATES
        or gate.active_refresh_id is not None
        or ScopeLock.objects.filter(source=source, namespace=gate.namespace).exists()
    ):
        return []
    workers = list(
        Worker.objects.filter(source=source, namespace=gate.namespace).exclude(
            state=WorkerState.GONE
        )
    )
    present = {w.instance_id for w in workers}
    lockorder.domain_lock("quarantines")
    open_quarantines = list(
        Quarantine.objects.select_for_update(no_key=True, of=("self",)).filter(
            source=source, namespace=gate.namespace, state__in=OPEN_QUARANTINE_STATES
        )
    )
    left = [q for q in open_quarantines if q.instance_id not in present]
    owned = {q.instance_id for q in open_quarantines if q.instance_id in present}
    # A running rollback drill owns its subset between its two refreshes (refresh/drills).
    owned |= drilled_instances(source, gate.namespace)
    known = {r.instance_id: r for r in ledger.current(source, [gate.namespace])}
    admitted = {iid: r for iid, r in known.items() if r.admitted}
    drifted = find_drift(gate, workers, owned, recovered_ids, admitted)

    policy = source.drift_policy
    outcome = _outcome_state(policy)
    # Entries that stay: open quarantines of present workers, and observed/closed drift that
    # is still drift (recomputed each time, so it disappears when the worker is fixed).
    kept = [d for d in gate.drift if d.get("instance_id") in owned]
    new_entries = [d.entry(outcome) for d in drifted]
    listed = {d.get("instance_id") for d in gate.drift}
    fresh = [e for e in new_entries if e["instance_id"] not in listed]
    drift = kept + new_entries
    held = Serving.QUARANTINED if policy == DriftPolicy.QUARANTINE else Serving.SERVING
    facts: dict[tuple[str, str], ledger.Change] = {
        (gate.namespace, iid): ledger.departed() for iid in known if iid not in present
    }
    for d in drifted:
        facts[(gate.namespace, d.worker.instance_id)] = ledger.reported(
            _declared(d.worker), key=d.worker.key, serving=held
        )
    for w in workers:  # admitted on a person's say-so without a readback: now it has one
        row = admitted.get(w.instance_id)
        if row is not None and row.evidence == Evidence.UNKNOWN and _declared(w) is not None:
            facts[(gate.namespace, w.instance_id)] = ledger.read_back(_declared(w), key=w.key)
    for w in workers:  # live workers the ledger never saw (owned by a quarantine, say)
        if w.instance_id not in known and w.state == WorkerState.LIVE:
            facts.setdefault(
                (gate.namespace, w.instance_id), ledger.reported(_declared(w), key=w.key)
            )

    close_reason = ""
    if policy == DriftPolicy.CLOSE and drifted:
        named = ", ".join(f"{d.worker.key} ({d.kind})" for d in drifted[:5])
        close_reason = f"drift: {named}; a refresh or a force-reopen reopens it"

    quarantines: list[Quarantine] = []
    if policy == DriftPolicy.QUARANTINE:
        for d in drifted:
            quarantines.append(
                Quarantine.objects.create(
                    source=source,
                    namespace=gate.namespace,
                    instance_id=d.worker.instance_id,
                    key=d.worker.key,
                    worker=d.worker,
                    kind=d.kind,
                    detail=d.detail,
                    target=gate.verified_policy,
                    reason="pause queued",
                )
            )
        for entry, q in zip(new_entries, quarantines, strict=True):
            entry["quarantine_id"] = q.pk
    now = timezone.now()
    for q in left:
        q.state, q.reason = QuarantineState.DROPPED, "left the fleet"
        q.updated_at = q.finished_at = now
        q.save(update_fields=["state", "reason", "updated_at", "finished_at"])

    gates.record_drift(
        gate,
        actor=RECONCILER,
        facts=facts,
        drift=drift,
        new=fresh,
        close_reason=close_reason,
        run=DiscoveryRun.objects.filter(pk=run_id).first() if run_id else None,
    )
    # Audit last (lock order): the quarantines opened and dropped.
    for q in quarantines:
        record(
            AuditAction.QUARANTINE_STARTED,
            actor=RECONCILER,
            target=q,
            details={"key": q.key, "kind": q.kind, "detail": q.detail, "namespace": q.namespace},
            correlation_id=q.correlation_id,
        )
        notify(NotificationEvent.DRIFT_QUARANTINED, quarantine=q)
    for q in left:
        record(
            AuditAction.QUARANTINE_DROPPED,
            actor=RECONCILER,
            target=q,
            details={"key": q.key, "reason": "left the fleet"},
            correlation_id=q.correlation_id,
        )
    return [q.pk for q in quarantines]


#: A quarantine's kind when the watch after a reopen found the worker unhealthy (errors or
#: latency beyond its template's limits: `intents/watch.py`), not a version or identity drift.
UNHEALTHY = "unhealthy"


@transaction.atomic
def quarantine_unhealthy(
    source: Source, namespace: str, found: list[tuple[Worker, str]], *, actor: Actor
) -> list[int]:
    """Quarantine admitted workers the watch after a reopen found unhealthy: each leaves the
    admitted set (a ledger fact), is paused and caught up like a drifted worker; its catch-up's
    verify decides whether it comes back. Workers another owner holds (an open quarantine, a
    refresh, a drill) are left alone. Returns the quarantines opened (the caller sends their
    catch-ups after commit)."""
    gate = gates.locked_gate(gates.gate_for(source, namespace).pk)
    if (
        gate is None
        or gate.state not in ADMITTING_STATES
        or gate.active_refresh_id is not None
        or ScopeLock.objects.filter(source=source, namespace=namespace).exists()
    ):
        return []
    lockorder.domain_lock("quarantines")
    owned = set(
        Quarantine.objects.filter(
            source=source, namespace=namespace, state__in=OPEN_QUARANTINE_STATES
        ).values_list("instance_id", flat=True)
    ) | drilled_instances(source, namespace)
    fresh = [(w, why) for w, why in found if w.instance_id not in owned]
    if not fresh:
        return []
    quarantines = [
        Quarantine.objects.create(
            source=source,
            namespace=namespace,
            instance_id=w.instance_id,
            key=w.key,
            worker=w,
            kind=UNHEALTHY,
            detail=why,
            target=gate.verified_policy,
            reason="pause queued",
        )
        for w, why in fresh
    ]
    entries: list[gates.DriftEntry] = [
        {
            "key": q.key,
            "instance_id": q.instance_id,
            "kind": UNHEALTHY,
            "detail": q.detail,
            "state": QuarantineState.QUARANTINED.value,
            "quarantine_id": q.pk,
        }
        for q in quarantines
    ]
    facts: dict[tuple[str, str], ledger.Change] = {
        (namespace, w.instance_id): ledger.reported(
            _declared(w), key=w.key, serving=Serving.QUARANTINED
        )
        for w, _why in fresh
    }
    gates.record_drift(gate, actor=actor, facts=facts, drift=[*gate.drift, *entries], new=entries)
    for q in quarantines:
        record(
            AuditAction.QUARANTINE_STARTED,
            actor=actor,
            target=q,
            details={"key": q.key, "kind": q.kind, "detail": q.detail, "namespace": q.namespace},
            correlation_id=q.correlation_id,
        )
        notify(NotificationEvent.DRIFT_QUARANTINED, quarantine=q)
    return [q.pk for q in quarantines]
