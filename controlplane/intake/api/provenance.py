"""The provenance trail of a weight version as JSON: the export for data lineage.

`GET /api/v1/provenance?instance_id=…&at=…` (or `from=…&to=…`) answers the other question,
from the serving ledger: which version(s) could that instance have served then, with the
evidence and how sure we are (`refresh/windows.py`).

`GET /api/v1/versions/{version}/provenance` joins the trainer's checkpoint events, the policy
refreshes that applied the version with each worker's outcome, the verified instance sets, the
gates at the version now and the admission windows replayed from the audit log. A token
limited to some sources sees only their part. A version no record names answers 404.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.http import Http404, HttpRequest
from ninja import Field, Query, Router, Schema

from controlplane.accounts.roles import Perm
from controlplane.intake.api.auth import require, token_source_ids
from controlplane.intake.api.derive import schema_of
from controlplane.intake.api.errors import COMMON_ERRORS, ApiError
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
from controlplane.refresh.windows import served_at

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


class ServedForcedOut(Schema):
    by: str
    at: str | None
    reason: str


class ServedIntervalOut(Schema):
    """One ledger interval of the instance that overlaps the time asked about."""

    source: str
    namespace: str
    instance_id: str
    key: str
    #: The versions it could have served in the interval (two while in transition).
    versions: list[Any]
    version: Any = None
    #: verified | forced | in_transition | unverified | departed
    confidence: str
    #: verified_refresh | verified_catch_up | reported | assumed | unknown
    evidence: str
    evidence_detail: dict[str, Any]
    admitted: bool
    #: verified | forced | "" (not admitted)
    admission: str
    #: serving | paused | quarantined | departed
    serving: str
    valid_from: datetime
    valid_to: datetime | None
    refresh_id: int | None
    quarantine_id: int | None
    transition_refresh_id: int | None
    forced: ServedForcedOut | None = None
    cause: str
    discovery_run_id: int | None
    journal_ids: list[int]


class InstanceProvenanceOut(Schema):
    instance_id: str
    at: datetime | None
    start: datetime | None = Field(None, alias="from")
    to: datetime | None
    #: Every version it could have served in the time asked about.
    versions: list[Any]
    intervals: list[ServedIntervalOut]


class InstanceProvenanceParams(Schema):
    instance_id: str = Field(pattern=r"^(0|[1-9][0-9]{0,19})$", max_length=20)
    at: datetime | None = None
    start: datetime | None = Field(None, alias="from")
    to: datetime | None = None


def _utc(moment: datetime) -> datetime:
    # PostgreSQL accepts offsets only up to ±15:59; a UTC instant is always in range.
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


@router.get(
    "/provenance",
    response={200: InstanceProvenanceOut, **COMMON_ERRORS},
    by_alias=True,
)
def get_instance_provenance(request: HttpRequest, params: Query[InstanceProvenanceParams]):
    """Which version(s) instance `instance_id` could have served at `at`, or during
    [`from`, `to`], from the serving ledger: each overlapping interval with its evidence and
    confidence (verified, forced, in_transition, unverified, departed)."""
    require(request, Perm.VIEW)
    if (params.at is None) == (params.start is None):
        raise ApiError(400, "bad_request", "give either `at`, or `from` (and optionally `to`)")
    if params.at is not None and params.to is not None:
        raise ApiError(400, "bad_request", "`to` goes with `from`, not with `at`")
    start = _utc(params.at or params.start)  # type: ignore[arg-type]
    end = (
        _utc(params.to)
        if params.to is not None
        else (None if params.at else _utc(datetime.now(UTC)))
    )
    if end is not None and end < start:
        raise ApiError(400, "bad_request", "`to` is before `from`")
    found = served_at(params.instance_id, start, end, source_ids=token_source_ids(request))
    versions: list[Any] = []
    for served in found:
        versions += [v for v in served.versions if v not in versions]
    return {
        "instance_id": params.instance_id,
        "at": params.at,
        "from": params.start,
        "to": params.to if params.start else None,
        "versions": versions,
        "intervals": [vars(s) for s in found],
    }
