"""Rollback drills: start one on a source, list a source's drills, read one.

Starting goes through `refresh.drills.actions.start_drill`, the one way a drill begins (the
source page's button, `manage.py drill`, the schedule): it checks the operate permission,
refuses with the messages the command prints, writes the drill and its `drill.started` audit
row together and queues the runner. Its refusals answer as the command's exit codes say: a
refresh or another drill active, a gate not open and verified, nothing verified before the
current policy or namespaces at different policies → 409 (the command's 5); a bad subset or
count → 422 (2); not permitted → 403 (3); no such source → 404 (4).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Path, Query, Router, Schema
from pydantic import Field

from controlplane.accounts.roles import Perm
from controlplane.intake.api import idempotency
from controlplane.intake.api.auth import actor, limit_to_sources, require, source_or_404
from controlplane.intake.api.errors import COMMON_ERRORS, ErrorOut
from controlplane.intake.api.pagination import PageParams, page_of, paginate
from controlplane.refresh.drills.actions import start_drill
from controlplane.refresh.drills.public import drill_json
from controlplane.refresh.models import DrillRun

router = Router(tags=["rollback drills"])

Id = Annotated[int, Path(ge=1, le=2**63 - 1)]
START_ERRORS = {409: ErrorOut, **COMMON_ERRORS}
Outcome = Literal["running", "succeeded", "failed"]  # DrillOutcome's values; a test keeps them


class DrillIn(Schema):
    namespaces: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None,
        max_length=100,
        description="drill only these namespaces (default: every verified namespace)",
    )
    # No lower bound here: a count below 1 is refused with the command's own message (422).
    count: int | None = Field(
        None,
        le=1_000_000,
        description="workers per namespace (default 1; at least one of each keeps serving)",
    )
    instances: list[Annotated[str, Field(min_length=1, max_length=20)]] | None = Field(
        None,
        max_length=10000,
        description="drill these instance ids (decimal strings) instead of a count",
    )


class DrillOut(Schema):
    id: int
    source: str
    namespaces: list[str]
    instances: list[str]
    from_version: Any = Field(
        None, description="the policy version the drill leaves and returns to"
    )
    to_version: Any = Field(None, description="the version verified before it, drilled to")
    phase: Literal["forward", "back", "done"]
    outcome: Outcome
    reason: str = Field(description="why the drill failed")
    next_step: str = Field(description="what a person does about the drilled workers")
    forward_refresh_id: int | None = Field(description="the policy refresh to the old version")
    back_refresh_id: int | None = Field(description="the policy refresh back")
    forward_seconds: float | None = Field(description="the forward refresh's first step to its end")
    back_seconds: float | None = Field(description="the back refresh's first step to its end")
    started_at: datetime
    finished_at: datetime | None
    requested_by: str
    scheduled: bool = Field(description="started by the source's drill schedule")


class DrillFilters(PageParams):
    outcome: Outcome | None = None


def _require_operate(request: HttpRequest) -> None:
    """The operate permission, refused in the words `manage.py drill` uses."""
    try:
        require(request, Perm.OPERATE_REFRESH)
    except PermissionDenied:
        who = request.user.get_username()
        raise PermissionDenied(
            f"{who} may not run rollback drills (needs {Perm.OPERATE_REFRESH.value})"
        ) from None


def _drills(request: HttpRequest):
    return limit_to_sources(request, DrillRun.objects.select_related("source"))


def _json(drill: DrillRun) -> dict[str, Any]:
    return DrillOut.model_validate(drill_json(drill)).model_dump(mode="json")


@router.post(
    "/sources/{name}/drills",
    response={201: DrillOut, **START_ERRORS},
    openapi_extra=idempotency.OPENAPI_PARAMETER,
)
def start_source_drill(
    request: HttpRequest, response: HttpResponse, name: str, payload: DrillIn | None = None
):
    """Start a rollback drill: a small subset of the source's scope refreshed to the policy
    verified before the current one and back, both verified and timed. It runs on the
    workers; poll `GET /api/v1/drills/{id}` until `outcome` is no longer `running`.

    409 while a refresh or another drill is active on the source, when a gate is not open and
    verified, or when nothing was verified before the current policy; 422 for a bad subset
    (a count below 1, an instance that is not a verified worker of the drilled namespaces,
    one that would leave a namespace without a serving worker, a count and instances both)."""
    _require_operate(request)
    source = source_or_404(request, name)
    given = payload or DrillIn.model_validate({})

    def start():
        drill = start_drill(
            source,
            actor=actor(request),
            namespaces=given.namespaces,
            count=given.count,
            instances=given.instances,
        )
        drill = DrillRun.objects.select_related("source").get(pk=drill.pk)
        return 201, _json(drill)

    return idempotency.run(request, response, start)


@router.get("/sources/{name}/drills", response={200: page_of(DrillOut), **COMMON_ERRORS})
def list_source_drills(request: HttpRequest, name: str, filters: Query[DrillFilters]):
    """The source's drills, newest first; `outcome` filters (e.g. `failed`)."""
    require(request, Perm.VIEW)
    source = source_or_404(request, name)
    drills = _drills(request).filter(source=source)
    if filters.outcome is not None:
        drills = drills.filter(outcome=filters.outcome)
    return paginate(drills.order_by("-started_at", "-id"), filters, _json)


@router.get("/drills/{drill_id}", response={200: DrillOut, **COMMON_ERRORS})
def get_drill(request: HttpRequest, drill_id: Id):
    """One drill: where it stands (`phase`, `outcome`), its two refreshes and how long each
    direction took, and, when it failed, why and what to do next."""
    require(request, Perm.VIEW)
    return _json(get_object_or_404(_drills(request), pk=drill_id))
