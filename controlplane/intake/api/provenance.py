"""The provenance trail of a weight version as JSON: the export for data lineage.

`GET /api/v1/versions/{version}/provenance` joins the trainer's checkpoint events, the policy
refreshes that applied the version with each worker's outcome, the verified instance sets, the
gates at the version now and the admission windows replayed from the audit log. A token
limited to some sources sees only their part. A version no record names answers 404.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest
from ninja import Router, Schema

from controlplane.accounts.roles import Perm
from controlplane.intake.api.auth import require, token_source_ids
from controlplane.intake.api.derive import schema_of
from controlplane.intake.api.errors import COMMON_ERRORS
from controlplane.intake.api.refreshes import RefreshOut, serialize_refresh
from controlplane.intake.provenance import trail
from controlplane.intake.provenance.trail import (
    AdmissionWindow,
    Checkpoint,
    RefreshTrail,
    Trail,
    WorkerOutcome,
)
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.models import Gate

router = Router(tags=["provenance"])


# Derived from the trail's dataclasses (`derive.schema_of`): a field added there is exported
# here. The gate schema is `serialize_gate`'s, not a trail dataclass's, so it is written out.
CheckpointOut = schema_of(Checkpoint, "CheckpointOut")
WorkerOutcomeOut = schema_of(WorkerOutcome, "WorkerOutcomeOut")
#: A refresh's own keys (`RefreshOut`, flattened from `refresh`), then its trail.
RefreshTrailOut = schema_of(
    RefreshTrail,
    "RefreshTrailOut",
    base=RefreshOut,
    nested={WorkerOutcome: WorkerOutcomeOut},
    exclude=frozenset({"refresh"}),
)
AdmissionWindowOut = schema_of(
    AdmissionWindow, "AdmissionWindowOut", properties=("open_now", "duration_seconds")
)


class GateAtVersionOut(Schema):
    source: str
    namespace: str
    state: str
    open: bool
    since: str | None
    verified_instances: list[str]
    verified_count: int
    unverified_count: int


ProvenanceOut = schema_of(
    Trail,
    "ProvenanceOut",
    nested={
        Checkpoint: CheckpointOut,
        RefreshTrail: RefreshTrailOut,
        AdmissionWindow: AdmissionWindowOut,
        Gate: GateAtVersionOut,
    },
)


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
