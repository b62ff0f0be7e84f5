"""`trail(version)`: every record of one weight version, in a fixed number of queries.

A version is stored as the trainer sent it (`"step-1200"` or `1200`); a URL carries text, so
`"1200"` finds both the string and the integer. Nothing here writes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from controlplane.intake.models import ReceivedWebhook
from controlplane.intake.webhooks.trainer.events import CHECKPOINT_READY
from controlplane.refresh.models import (
    ADMITTING_STATES,
    Gate,
    GateState,
    PlannedWorker,
    PolicyRefresh,
    WorkerStepResult,
)
from controlplane.refresh.step_order import WORKER_STEPS, StepName

#: The audit actions that move a gate between admitting and not (drift and reconcile rows
#: do not change its state).
GATE_STATE_ACTIONS = (
    AuditAction.GATE_OPENED,
    AuditAction.GATE_FORCE_REOPENED,
    AuditAction.GATE_CLOSED,
    AuditAction.GATE_UNKNOWN,
    AuditAction.GATE_KNOWN,
)
_FAILED = ("failed", "unreached")
_INTEGER = re.compile(r"-?(0|[1-9][0-9]{0,17})")


def version_key(version: Any) -> str:
    """The text form a version is compared and linked by."""
    return str(version)


def _version_q(lookup: str, version: str) -> Q:
    q = Q(**{lookup: version})
    if _INTEGER.fullmatch(version):
        q |= Q(**{lookup: int(version)})
    return q


@dataclass
class WorkerOutcome:
    key: str
    namespace: str
    instance_id: str
    family: str
    #: Latest status per worker step (`ok`, `failed`, `skipped`, `unreached`); absent: not run.
    steps: dict[str, str]
    error: str
    verified: bool
    #: What the worker reports now (discovery's last probe); None when it is gone or silent.
    reported_version: Any
    worker_state: str

    @property
    def cells(self) -> list[str]:
        """The statuses in the order of the worker steps ("" where the step did not run)."""
        return [self.steps.get(step, "") for step in WORKER_STEPS]


@dataclass
class RefreshTrail:
    refresh: PolicyRefresh
    workers: list[WorkerOutcome]
    #: Namespace → instance ids whose verify step passed at this version.
    verified_instances: dict[str, list[str]]


@dataclass
class Checkpoint:
    webhook_id: str
    endpoint: str
    source: str
    received_at: datetime
    sent_at: str | None
    step: int | None
    model_path: str | None
    method: str
    checkpoint_digest: str | None
    metrics: dict[str, Any]
    state: str
    outcome: str
    refresh_id: int | None


@dataclass
class AdmissionWindow:
    source: str
    namespace: str
    opened_at: datetime
    opened_by: str
    forced: bool
    refresh_id: int | None
    verified_count: int | None
    closed_at: datetime | None = None
    closed_by: str = ""
    closed_reason: str = ""

    @property
    def open_now(self) -> bool:
        return self.closed_at is None

    @property
    def duration_seconds(self) -> float:
        end = self.closed_at or timezone.now()
        return max((end - self.opened_at).total_seconds(), 0.0)


@dataclass
class Trail:
    weight_version: str
    generated_at: datetime
    checkpoints: list[Checkpoint] = field(default_factory=list)
    refreshes: list[RefreshTrail] = field(default_factory=list)
    admission: list[AdmissionWindow] = field(default_factory=list)
    #: Gates whose verified version is this one now.
    gates: list[Gate] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.checkpoints or self.refreshes or self.gates)


def trail(version: str, *, source_ids: Iterable[int] | None = None) -> Trail:
    """Everything known about `version`, limited to `source_ids` when given (a scoped token)."""
    limit = None if source_ids is None else set(source_ids)
    refreshes = PolicyRefresh.objects.select_related("source", "approved_by").filter(
        _version_q("target__weight_version", version)
    )
    if limit is not None:
        refreshes = refreshes.filter(source_id__in=limit)
    found = list(refreshes.order_by("id"))
    ids = [r.pk for r in found]
    result = Trail(weight_version=version, generated_at=timezone.now())
    result.checkpoints = _checkpoints(version, ids, limit)
    result.refreshes = _refresh_trails(found)
    source_ids_seen = {r.source_id for r in found}
    gates = list(
        Gate.objects.select_related("source")
        .filter(source_id__in=source_ids_seen)
        .order_by("source__name", "namespace")
    )
    result.gates = [
        g
        for g in gates
        if g.verified_version is not None and version_key(g.verified_version) == version
    ]
    if found:
        result.admission = _admission(version, set(ids), gates, found[0].created_at)
    return result


def _checkpoints(version: str, refresh_ids: list[int], limit: set[int] | None) -> list[Checkpoint]:
    rows = ReceivedWebhook.objects.select_related("endpoint__source").filter(
        Q(refresh_id__in=refresh_ids) | _version_q("payload__data__weight_version", version),
        event_type=CHECKPOINT_READY,
    )
    if limit is not None:
        rows = rows.filter(endpoint__source_id__in=limit)
    out = []
    for row in rows.order_by("received_at", "id"):
        payload = _mapping(row.payload)
        data = _mapping(payload.get("data"))
        metrics = _mapping(data.get("metrics"))
        step = data.get("step")
        out.append(
            Checkpoint(
                webhook_id=row.webhook_id,
                endpoint=row.endpoint.name,
                source=row.endpoint.source.name,
                received_at=row.received_at,
                sent_at=_text_or_none(payload.get("timestamp")),
                step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                model_path=_text_or_none(data.get("model_path")),
                method="distributed" if data.get("distributed") else "disk",
                checkpoint_digest=_text_or_none(data.get("checkpoint_digest")),
                metrics=metrics,
                state=row.state,
                outcome=row.outcome,
                refresh_id=row.refresh_id,
            )
        )
    return out


def _mapping(value: Any) -> dict[str, Any]:
    """A stored payload part as a dict (a malformed one as empty: it is shown, never trusted)."""
    return value if isinstance(value, dict) else {}


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _refresh_trails(refreshes: list[PolicyRefresh]) -> list[RefreshTrail]:
    ids = [r.pk for r in refreshes]
    latest: dict[int, dict[str, tuple[str, str]]] = {}
    results = WorkerStepResult.objects.filter(refresh_id__in=ids).order_by("id")
    for worker_id, step, status, error in results.values_list(
        "planned_worker_id", "step", "status", "error"
    ):
        latest.setdefault(worker_id, {})[step] = (status, error)  # latest attempt wins
    by_refresh: dict[int, list[WorkerOutcome]] = {pk: [] for pk in ids}
    planned = PlannedWorker.objects.filter(refresh_id__in=ids).select_related("worker")
    for pw in planned.order_by("refresh_id", "namespace", "key"):
        steps = latest.get(pw.pk, {})
        # Why a step failed (a skipped step's note, e.g. "the update already flushed", is not).
        outcomes = [steps[s] for s in WORKER_STEPS if s in steps]
        errors = [error for status, error in outcomes if status in _FAILED and error]
        live = pw.worker
        by_refresh[pw.refresh_id].append(
            WorkerOutcome(
                key=pw.key,
                namespace=pw.namespace,
                instance_id=pw.instance_id,
                family=pw.family,
                steps={s: steps[s][0] for s in WORKER_STEPS if s in steps},
                error=errors[-1] if errors else "",
                verified=steps.get(StepName.VERIFY, ("", ""))[0] == "ok",
                reported_version=live.weight_version if live is not None else None,
                worker_state=live.state if live is not None else "gone",
            )
        )
    out = []
    for refresh in refreshes:
        workers = by_refresh[refresh.pk]
        verified: dict[str, list[str]] = {}
        for w in workers:
            if w.verified:
                verified.setdefault(w.namespace, []).append(w.instance_id)
        for namespace in verified:
            verified[namespace].sort(key=lambda iid: (len(iid), iid))
        out.append(RefreshTrail(refresh=refresh, workers=workers, verified_instances=verified))
    return out


def _admission(
    version: str, refresh_ids: set[int], gates: list[Gate], since: datetime
) -> list[AdmissionWindow]:
    """Replay each gate's state changes from the audit log: a window opens when the gate
    admits at this version (verified at it, or force-reopened by one of its refreshes) and
    closes at the next change that stops admitting or admits another version."""
    by_id = {str(g.pk): g for g in gates}
    events = (
        AuditEvent.objects.filter(
            target_type=Gate._meta.label_lower,
            target_id__in=list(by_id),
            action__in=[a.value for a in GATE_STATE_ACTIONS],
            occurred_at__gte=since,
        )
        .order_by("sequence")
        .values_list("target_id", "occurred_at", "actor_label", "details")
    )
    known_version: dict[str, str | None] = {}
    current: dict[str, AdmissionWindow] = {}
    windows: list[AdmissionWindow] = []
    for gate_id, at, actor, details in events:
        details = details if isinstance(details, dict) else {}
        state = details.get("state")
        if "verified_version" in details:
            seen = details["verified_version"]
            known_version[gate_id] = None if seen is None else version_key(seen)
        admitting = state in ADMITTING_STATES
        ours = admitting and (
            (state == GateState.OPEN and known_version.get(gate_id) == version)
            or (state == GateState.OPEN_FORCED and details.get("refresh_id") in refresh_ids)
        )
        window = current.get(gate_id)
        if ours and window is None:
            gate = by_id[gate_id]
            count = details.get("verified_count")
            current[gate_id] = AdmissionWindow(
                source=gate.source.name,
                namespace=gate.namespace,
                opened_at=at,
                opened_by=actor,
                forced=state == GateState.OPEN_FORCED,
                refresh_id=details.get("refresh_id"),
                verified_count=count if isinstance(count, int) else None,
            )
        elif window is not None and not ours:
            window.closed_at = at
            window.closed_by = actor
            reason = details.get("reason")
            window.closed_reason = reason if isinstance(reason, str) else ""
            windows.append(current.pop(gate_id))
    windows.extend(current.values())
    return sorted(windows, key=lambda w: (w.opened_at, w.source, w.namespace))
