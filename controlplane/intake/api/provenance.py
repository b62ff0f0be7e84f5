"""The provenance trail of a weight version as JSON: the export for data lineage.

`GET /api/v1/versions/{version}/provenance` joins the trainer's checkpoint events, the policy
refreshes that applied the version with each worker's outcome, the verified instance sets, the
gates at the version now and the admission windows replayed from the audit log. A token
limited to some sources sees only their part. A version no record names answers 404.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import Http404, HttpRequest
from ninja import Router, Schema

from controlplane.accounts.roles import Perm
from controlplane.intake.api.auth import require, token_source_ids
from controlplane.intake.api.errors import COMMON_ERRORS
from controlplane.intake.api.refreshes import RefreshOut, serialize_refresh
from controlplane.intake.provenance import trail
from controlplane.intake.provenance.trail import Trail
from controlplane.refresh.gates import serialize_gate

router = Router(tags=["provenance"])


class CheckpointOut(Schema):
    webhook_id: str
    endpoint: str
    source: str
    received_at: datetime
    #: The event's own `timestamp`, as the trainer wrote it.
    sent_at: str | None
    step: int | None
    model_path: str | None
    method: str
    checkpoint_digest: str | None
    metrics: dict[str, Any]
    state: str
    outcome: str
    refresh_id: int | None


class WorkerOutcomeOut(Schema):
    key: str
    namespace: str
    instance_id: str
    family: str
    steps: dict[str, str]
    error: str
    verified: bool
    reported_version: Any = None
    worker_state: str


class RefreshTrailOut(RefreshOut):
    workers: list[WorkerOutcomeOut]
    verified_instances: dict[str, list[str]]


class AdmissionWindowOut(Schema):
    source: str
    namespace: str
    opened_at: datetime
    opened_by: str
    forced: bool
    refresh_id: int | None
    verified_count: int | None
    closed_at: datetime | None
    closed_by: str
    closed_reason: str
    open_now: bool
    duration_seconds: float


class GateAtVersionOut(Schema):
    source: str
    namespace: str
    state: str
    open: bool
    since: str | None
    verified_instances: list[str]
    verified_count: int
    unverified_count: int


class ProvenanceOut(Schema):
    weight_version: str
    generated_at: datetime
    checkpoints: list[CheckpointOut]
    refreshes: list[RefreshTrailOut]
    admission: list[AdmissionWindowOut]
    gates: list[GateAtVersionOut]


def serialize_trail(found: Trail) -> dict[str, Any]:
    return {
        "weight_version": found.weight_version,
        "generated_at": found.generated_at,
        "checkpoints": [vars(c) for c in found.checkpoints],
        "refreshes": [
            {
                **serialize_refresh(t.refresh),
                "workers": [vars(w) for w in t.workers],
                "verified_instances": t.verified_instances,
            }
            for t in found.refreshes
        ],
        "admission": [
            {**vars(w), "open_now": w.open_now, "duration_seconds": w.duration_seconds}
            for w in found.admission
        ],
        "gates": [serialize_gate(g) for g in found.gates],
    }


@router.get(
    "/versions/{path:version}/provenance",
    response={200: ProvenanceOut, **COMMON_ERRORS},
)
def get_provenance(request: HttpRequest, version: str):
    """Checkpoint, refreshes, per-worker results, verified instances and admission windows of
    one weight version (`1200` also finds a version sent as the integer 1200)."""
    require(request, Perm.VIEW)
    found = trail(version, source_ids=token_source_ids(request))
    if found.empty:
        raise Http404(f"no record names weight version {version!r}")
    return serialize_trail(found)
