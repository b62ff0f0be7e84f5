"""Quarantined workers: list, read (with the call journal) and their exits — retry, release,
drop. Every exit runs through its row of `refresh.action_table` (permission, audit); an exit
the quarantine's state does not allow answers 409 and changes nothing."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Path, Query, Router, Schema
from pydantic import Field

from controlplane.accounts.roles import Perm
from controlplane.intake.api import idempotency
from controlplane.intake.api.auth import actor, limit_to_sources, require
from controlplane.intake.api.errors import COMMON_ERRORS, ApiError, ErrorOut
from controlplane.intake.api.pagination import PageParams, page_of, paginate
from controlplane.refresh.intents import action_table
from controlplane.refresh.intents.action_table import Action, ActionInput
from controlplane.refresh.models import Quarantine
from controlplane.refresh.quarantine import (
    QuarantineRefused,
    serialize_journal,
    serialize_quarantine,
)

router = Router(tags=["quarantines"])

Id = Annotated[int, Path(ge=1, le=2**63 - 1)]
ACTION_ERRORS = {409: ErrorOut, **COMMON_ERRORS}
States = Literal[
    "quarantined", "catching_up", "admitted", "failed", "released", "dropped", "superseded"
]  # QuarantineState's values; a test keeps them equal


class QuarantineOut(Schema):
    id: int
    source: str
    namespace: str
    #: u64 as a decimal string, like the gate's verified set.
    instance_id: str
    key: str
    worker_id: int | None
    #: joined | version | recovered
    kind: str
    detail: str
    state: States
    reason: str
    paused: bool
    attempts: int
    target_version: Any = None
    created_at: datetime
    updated_at: datetime
    heartbeat_at: datetime | None
    finished_at: datetime | None


class QuarantineCallOut(Schema):
    id: int
    step: str
    attempt: int
    operation: str
    method: str
    url: str
    http_status: int | None
    ok: bool
    error: str
    duration_ms: float
    started_at: datetime
    finished_at: datetime


class QuarantineDetailOut(QuarantineOut):
    journal: list[QuarantineCallOut]


class QuarantineFilters(PageParams):
    source: str | None = Field(None, max_length=64)
    state: States | None = None


class ReleaseIn(Schema):
    reason: str = Field(min_length=1, max_length=2000)


def _quarantines(request: HttpRequest):
    return limit_to_sources(request, Quarantine.objects.select_related("source"))


@router.get("/quarantines", response={200: page_of(QuarantineOut), **COMMON_ERRORS})
def list_quarantines(request: HttpRequest, filters: Query[QuarantineFilters]):
    """Quarantines, newest first; `state` filters (e.g. `failed`: the ones waiting for a person)."""
    require(request, Perm.VIEW)
    rows = _quarantines(request)
    if filters.source is not None:
        rows = rows.filter(source__name=filters.source)
    if filters.state is not None:
        rows = rows.filter(state=filters.state)
    return paginate(rows.order_by("-id"), filters, serialize_quarantine)


@router.get("/quarantines/{quarantine_id}", response={200: QuarantineDetailOut, **COMMON_ERRORS})
def get_quarantine(request: HttpRequest, quarantine_id: Id):
    """One quarantine with every admin and generation call made for it."""
    require(request, Perm.VIEW)
    q = get_object_or_404(_quarantines(request), pk=quarantine_id)
    return {**serialize_quarantine(q), "journal": serialize_journal(q)}


def _exit(
    request: HttpRequest,
    response: HttpResponse,
    quarantine_id: int,
    action: Action[Quarantine],
    given: ActionInput | None = None,
):
    require(request, action.perm)
    q = get_object_or_404(_quarantines(request), pk=quarantine_id)

    def act():
        try:
            action.run(q, actor(request), given or ActionInput())
        except QuarantineRefused as exc:
            raise ApiError(409, "conflict", "; ".join(exc.messages)) from None
        fresh = Quarantine.objects.select_related("source").get(pk=q.pk)
        return 200, QuarantineOut.model_validate(serialize_quarantine(fresh)).model_dump(
            mode="json"
        )

    return idempotency.run(request, response, act)


def _exit_route(action: Action[Quarantine]):
    return router.post(
        f"/quarantines/{{quarantine_id}}/{action.name}",
        response={200: QuarantineOut, **ACTION_ERRORS},
        openapi_extra=idempotency.OPENAPI_PARAMETER,
    )


@_exit_route(action_table.RETRY_QUARANTINE)
def retry_quarantine(request: HttpRequest, response: HttpResponse, quarantine_id: Id):
    """Queue the catch-up again: a failed one, a queued one, or one whose runner went silent."""
    return _exit(request, response, quarantine_id, action_table.RETRY_QUARANTINE)


@_exit_route(action_table.RELEASE_QUARANTINE)
def release_quarantine(
    request: HttpRequest, response: HttpResponse, quarantine_id: Id, payload: ReleaseIn
):
    """Resume the worker without admitting it, with a written reason. Refused (409) unless its
    version readback is the gate's verified version: a released worker serves unpinned traffic."""
    given = ActionInput(reason=payload.reason)
    return _exit(request, response, quarantine_id, action_table.RELEASE_QUARANTINE, given)


@_exit_route(action_table.DROP_QUARANTINE)
def drop_quarantine(request: HttpRequest, response: HttpResponse, quarantine_id: Id):
    """Forget the quarantine of a worker that left the fleet (409 while it is still there)."""
    return _exit(request, response, quarantine_id, action_table.DROP_QUARANTINE)
