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

from controlplane.intake.models import ReceivedWebhook
from controlplane.intake.webhooks.trainer.events import CHECKPOINT_READY
from controlplane.refresh.models import (
    Gate,
    PlannedWorker,
    PolicyRefresh,
    WorkerStepResult,
)
from controlplane.refresh.step_order import WORKER_STEPS, StepName
from controlplane.refresh.windows import admission_windows

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
        result.admission = _admission(version, limit)
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
    # Only the columns the trail shows: a planned worker's row also holds its planned calls,
    # and a worker's its routes and probes, which at 10,000 workers were most of the web
    # process's peak while this export was built (`bench/memory.py`).
    planned = (
        PlannedWorker.objects.filter(refresh_id__in=ids)
        .order_by("refresh_id", "namespace", "key")
        .values_list(
            "pk",
            "refresh_id",
            "key",
            "namespace",
            "instance_id",
            "family",
            "worker_id",
            "worker__weight_version",
            "worker__state",
        )
    )
    for pk, refresh_id, key, namespace, instance_id, family, live, version, state in planned:
        steps = latest.get(pk, {})
        # Why a step failed (a skipped step's note, e.g. "the update already flushed", is not).
        outcomes = [steps[s] for s in WORKER_STEPS if s in steps]
        errors = [error for status, error in outcomes if status in _FAILED and error]
        by_refresh[refresh_id].append(
            WorkerOutcome(
                key=key,
                namespace=namespace,
                instance_id=instance_id,
                family=family,
                steps={s: steps[s][0] for s in WORKER_STEPS if s in steps},
                error=errors[-1] if errors else "",
                verified=steps.get(StepName.VERIFY, ("", ""))[0] == "ok",
                reported_version=version if live is not None else None,
                worker_state=state if live is not None else "gone",
            )
        )
    out = []
    for refresh in refreshes:
        workers = by_refresh[refresh.pk]
        verified: dict[str, list[str]] = {}
        for w in workers:
            if w.verified and w.instance_id:  # an unidentified static worker is never verified
                verified.setdefault(w.namespace, []).append(w.instance_id)
        for namespace in verified:
            verified[namespace].sort(key=lambda iid: (len(iid), iid))
        out.append(RefreshTrail(refresh=refresh, workers=workers, verified_instances=verified))
    return out


def _admission(version: str, limit: set[int] | None) -> list[AdmissionWindow]:
    """The namespaces' admission windows at this version, from the serving ledger's version
    windows (`refresh/windows.py`): a window opens when its gate admits an instance at the
    version (verified at it, or force-reopened while serving it) and closes when no instance
    is admitted at it any more."""
    return [
        AdmissionWindow(
            source=span.source,
            namespace=span.namespace,
            opened_at=span.start,
            opened_by=span.opened_by,
            forced=span.forced,
            refresh_id=span.refresh_id,
            verified_count=len(span.instances),
            closed_at=span.end,
            closed_by=span.closed_by if span.end else "",
            closed_reason=span.closed_by if span.end else "",
        )
        for span in admission_windows(version, source_ids=limit)
    ]
