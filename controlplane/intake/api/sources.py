"""Sources: list, read, create, update, delete, and "refresh now" (a discovery run).

A source's `default_strategy` is validated here and stored by `refresh.source_strategy` (only
the refresh app knows a strategy), in the same transaction as the source's other changes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from ninja import Query, Router, Schema, Status
from pydantic import AliasChoices, Field, WithJsonSchema

from controlplane import jobs
from controlplane.accounts.roles import Perm
from controlplane.fleet import services
from controlplane.intake.api import idempotency
from controlplane.intake.api.auth import (
    actor,
    require,
    require_unlimited,
    source_or_404,
    visible_sources,
)
from controlplane.intake.api.errors import COMMON_ERRORS, ApiError, ErrorOut
from controlplane.intake.api.pagination import PageParams, page_of, paginate
from controlplane.intake.strategy import STRATEGY_SCHEMA, StrategyRefused, checked
from controlplane.refresh.source_strategy import set_default_strategy
from controlplane.refresh.strategy import StrategyJson

router = Router(tags=["sources"])

Text = Field(max_length=500)
#: The verify step's cross-worker agreement rule (see controlplane/dynamo/fingerprint.py).
AgreementKind = Literal["exact", "logprob"]
DriftPolicyName = Literal["quarantine", "close", "observe"]
DRIFT_POLICY_HELP = (
    "what drift does: quarantine (pause, catch up alone, admit back), close the gate, or observe"
)
MaxLagActionName = Literal["observe", "alert", "close"]
MAX_LAG_HELP = (
    "what a namespace serving a policy more than `max_lag_steps` behind the trainer's latest "
    "published one does: observe, alert (notify), or close its gate as stale_policy until a "
    "refresh brings it within bounds"
)
MAX_LAG_STEPS_HELP = "training steps the served policy may be behind the latest published one"
DRILL_EVERY_HELP = "hours between scheduled rollback drills of a small canary subset; 0 = never"
AGREEMENT_TOKENS_HELP = "how many leading completion tokens workers of one model must agree on"


StrategyField = Annotated[dict[str, Any], WithJsonSchema(STRATEGY_SCHEMA)]
STRATEGY_HELP = (
    "the refresh strategy plans of this source get unless they name one; {} = all at once. "
    "400 with field errors when it does not validate"
)


def _strategy_or_400(raw: dict[str, Any] | None) -> StrategyJson | None:
    if raw is None:
        return None
    try:
        return checked(raw).to_dict()
    except StrategyRefused as exc:
        raise ApiError(400, "invalid_strategy", str(exc), exc.errors) from None


DECLARED_FAMILY_HELP = (
    "the backend family where routes cannot tell (native sidecars all advertise control/* and "
    "update/*): vllm, vllm-sidecar, sglang, sglang-sidecar or trtllm-sidecar; blank = routes only"
)
DYNAMO_RELEASE_HELP = "the Dynamo release the workers run: 1.6.1 or 1.7; blank = 1.6.1"
ListenerScopeName = Literal["", "exact", "prefix", "suffix", "global"]
LISTENER_SCOPE_HELP = (
    "the namespace scope the RL listener is expected to have: exact, prefix, suffix or global "
    "('' = undeclared: follow the listener, but refuse a global one); workers outside it are "
    "refused on every discovery"
)


class SourceOut(Schema):
    id: int
    name: str
    listener_url: str
    frontend_url: str
    expected_namespace: str
    expected_prefix: str
    expected_worker_suffix: str
    listener_scope: str = Field("", description=LISTENER_SCOPE_HELP)
    allowed_networks: list[str]
    discovery_interval_seconds: float
    require_approval: bool
    enabled: bool
    agreement_rule: str
    agreement_tokens: int
    agreement_epsilon: float
    drift_policy: str
    drill_every: int
    declared_family: str = Field("", description=DECLARED_FAMILY_HELP)
    declared_families: dict[str, str] = Field(default_factory=dict)
    dynamo_release: str = Field("", description=DYNAMO_RELEASE_HELP)
    max_lag_action: str
    max_lag_steps: int
    default_strategy: dict[str, Any] = Field(
        default_factory=dict,
        description="the strategy plans get unless they name one ({} = all at once)",
    )
    reported_namespace: str
    stale: bool
    stale_reason: str
    last_success_at: datetime | None
    created_at: datetime
    updated_at: datetime


#: The discovery interval's name, and the one it had before the fleet side said "discovery"
#: (still accepted on input; answers carry the new name only).
INTERVAL_NAMES = AliasChoices("discovery_interval_seconds", "refresh_interval_seconds")
INTERVAL_HELP = "Seconds between discovery runs (formerly `refresh_interval_seconds`)."


class SourceIn(Schema):
    name: str = Field(max_length=64)
    listener_url: str = Text
    frontend_url: str = Field("", max_length=500)
    expected_namespace: str = Field("", max_length=200)
    expected_prefix: str = Field("", max_length=200)
    expected_worker_suffix: str = Field("", max_length=200)
    listener_scope: ListenerScopeName = Field("", description=LISTENER_SCOPE_HELP)
    allowed_networks: list[str] = Field(default_factory=list, max_length=100)
    discovery_interval_seconds: float = Field(
        10.0, ge=1.0, le=86400.0, validation_alias=INTERVAL_NAMES, description=INTERVAL_HELP
    )
    require_approval: bool = False
    enabled: bool = True
    agreement_rule: AgreementKind = "exact"
    agreement_tokens: int = Field(8, ge=1, le=256, description=AGREEMENT_TOKENS_HELP)
    agreement_epsilon: float = Field(0.05, gt=0, le=10, allow_inf_nan=False)
    drift_policy: DriftPolicyName = Field("quarantine", description=DRIFT_POLICY_HELP)
    drill_every: int = Field(0, ge=0, le=24 * 365, description=DRILL_EVERY_HELP)
    declared_family: str = Field("", max_length=32, description=DECLARED_FAMILY_HELP)
    declared_families: dict[str, str] = Field(default_factory=dict, max_length=200)
    dynamo_release: str = Field("", max_length=16, description=DYNAMO_RELEASE_HELP)
    max_lag_action: MaxLagActionName = Field("observe", description=MAX_LAG_HELP)
    max_lag_steps: int = Field(1, ge=0, le=10**9, description=MAX_LAG_STEPS_HELP)
    default_strategy: StrategyField | None = Field(None, description=STRATEGY_HELP)


class SourcePatch(Schema):
    name: str | None = Field(None, max_length=64)
    listener_url: str | None = Field(None, max_length=500)
    frontend_url: str | None = Field(None, max_length=500)
    expected_namespace: str | None = Field(None, max_length=200)
    expected_prefix: str | None = Field(None, max_length=200)
    expected_worker_suffix: str | None = Field(None, max_length=200)
    listener_scope: ListenerScopeName | None = Field(None, description=LISTENER_SCOPE_HELP)
    allowed_networks: list[str] | None = Field(None, max_length=100)
    discovery_interval_seconds: float | None = Field(
        None, ge=1.0, le=86400.0, validation_alias=INTERVAL_NAMES, description=INTERVAL_HELP
    )
    require_approval: bool | None = None
    enabled: bool | None = None
    agreement_rule: AgreementKind | None = None
    agreement_tokens: int | None = Field(None, ge=1, le=256, description=AGREEMENT_TOKENS_HELP)
    agreement_epsilon: float | None = Field(None, gt=0, le=10, allow_inf_nan=False)
    drift_policy: DriftPolicyName | None = Field(None, description=DRIFT_POLICY_HELP)
    drill_every: int | None = Field(None, ge=0, le=24 * 365, description=DRILL_EVERY_HELP)
    declared_family: str | None = Field(None, max_length=32, description=DECLARED_FAMILY_HELP)
    declared_families: dict[str, str] | None = Field(None, max_length=200)
    dynamo_release: str | None = Field(None, max_length=16, description=DYNAMO_RELEASE_HELP)
    max_lag_action: MaxLagActionName | None = Field(None, description=MAX_LAG_HELP)
    max_lag_steps: int | None = Field(None, ge=0, le=10**9, description=MAX_LAG_STEPS_HELP)
    default_strategy: StrategyField | None = Field(None, description=STRATEGY_HELP)


class Accepted(Schema):
    status: str = Field(
        description="`queued` when the discovery reached the task queue, else `accepted`"
    )
    source: str
    queued: bool = Field(
        True,
        description="whether the discovery reached the task queue. false: the request is "
        "recorded all the same, and `recovery` says what runs the source's discovery instead",
    )
    recovery: str | None = Field(None, description="when `queued` is false: what runs it")


def serialize_source(source) -> dict:
    return SourceOut.from_orm(source).model_dump(mode="json")


@router.get("/sources", response={200: page_of(SourceOut), **COMMON_ERRORS})
def list_sources(request: HttpRequest, page: Query[PageParams]):
    """Sources the caller may see (all, or those a limited token names)."""
    require(request, Perm.VIEW)
    return paginate(visible_sources(request).order_by("name"), page, serialize_source)


@router.post("/sources", response={201: SourceOut, **COMMON_ERRORS})
def create_source(request: HttpRequest, payload: SourceIn):
    require(request, Perm.MANAGE_SOURCES)
    require_unlimited(request)
    values = payload.model_dump()
    strategy = _strategy_or_400(values.pop("default_strategy"))
    with transaction.atomic():
        source = services.create_source(actor=actor(request), **values)
        if strategy is not None:
            source = set_default_strategy(source, strategy, actor=actor(request))
    return Status(201, serialize_source(source))


@router.get("/sources/{name}", response={200: SourceOut, **COMMON_ERRORS})
def get_source(request: HttpRequest, name: str):
    require(request, Perm.VIEW)
    return serialize_source(source_or_404(request, name))


@router.patch("/sources/{name}", response={200: SourceOut, **COMMON_ERRORS})
def update_source(request: HttpRequest, name: str, payload: SourcePatch):
    require(request, Perm.MANAGE_SOURCES)
    source = source_or_404(request, name)
    changes = payload.model_dump(exclude_unset=True, exclude_none=True)
    strategy = _strategy_or_400(changes.pop("default_strategy", None))
    with transaction.atomic():
        source = services.update_source(source, actor=actor(request), **changes)
        if strategy is not None:
            source = set_default_strategy(source, strategy, actor=actor(request))
    return serialize_source(source)


@router.delete("/sources/{name}", response={204: None, **COMMON_ERRORS})
def delete_source(request: HttpRequest, name: str):
    require(request, Perm.MANAGE_SOURCES)
    source = source_or_404(request, name)
    services.remove_source(source, actor=actor(request))
    return Status(204, None)


@router.post(
    "/sources/{name}/refresh",
    response={202: Accepted, 409: ErrorOut, **COMMON_ERRORS},
    openapi_extra=idempotency.OPENAPI_PARAMETER,
)
def run_discovery_now(request: HttpRequest, response: HttpResponse, name: str):
    """Run a discovery run of the source now (on a Celery worker)."""
    require(request, Perm.RUN_DISCOVERY)
    source = source_or_404(request, name)

    def start():
        # The request is audited and committed before the task is sent: a broker outage is
        # said in the answer, never turned into an error for a recorded request.
        with jobs.tracking() as sends:
            services.request_discovery(source, actor=actor(request))
        if sends.all_sent:
            return 202, {"status": "queued", "source": source.name, "queued": True}
        return 202, {
            "status": "accepted",
            "source": source.name,
            "queued": False,
            "recovery": "the task queue was unavailable; the scheduled discovery runs the "
            f"source within {source.discovery_interval_seconds:g} s of the queue's return",
        }

    return idempotency.run(request, response, start)
