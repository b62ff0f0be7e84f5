"""The gate API rollout frameworks poll: is a scope open, at which verified policy version.

Built to be polled every second by many clients: one indexed query for the gate, an `ETag`
from the gate's revision, and `If-None-Match` answered with 304 before any serialisation.
"""

from __future__ import annotations

import zlib
from typing import Any, Literal

from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from ninja import Query, Router, Schema, Status
from pydantic import Field

from controlplane.accounts.roles import Perm
from controlplane.intake.api import idempotency
from controlplane.intake.api.auth import actor, limit_to_sources, require, source_or_404
from controlplane.intake.api.errors import COMMON_ERRORS, ErrorOut
from controlplane.intake.api.pagination import PageParams, page_of, paginate
from controlplane.refresh.action_table import FORCE_REOPEN, ActionInput
from controlplane.refresh.gates import gate_state, serialize_gate
from controlplane.refresh.models import ADMITTING_STATES, Gate

router = Router(tags=["gates"])

CACHE_CONTROL = "private, no-cache"


class ForcedOut(Schema):
    by: str
    at: str | None
    reason: str


class DriftOut(Schema):
    key: str
    instance_id: str
    kind: str
    detail: str = ""


class GateOut(Schema):
    source: str
    namespace: str
    state: Literal["open", "open_forced", "closed", "unknown"]
    #: Rollouts are admitted: `open` (verified) or `open_forced` (a person's decision).
    open: bool
    since: str | None
    reason: str
    forced: ForcedOut | None = None
    verified_version: Any = None
    #: Instance ids (u64 as decimal strings) verified at `verified_version`; pin generations
    #: to them with `nvext.backend_instance_id`.
    verified_instances: list[str]
    verified_count: int
    unverified_count: int
    confirmed_at: str | None
    drift: list[DriftOut]
    drift_count: int
    active_refresh_id: int | None
    revision: int
    updated_at: str | None


class GateFilters(PageParams):
    source: str | None = Field(None, max_length=64)
    open: bool | None = None


class ForceReopenIn(Schema):
    reason: str = Field(min_length=1, max_length=2000)


def etag_for(source_id: int, namespace: str, revision: int) -> str:
    # crc32, not hash(): every web replica must compute the same tag for the same gate.
    return f'"{source_id}.{zlib.crc32(namespace.encode()):08x}.{revision}"'


def _not_modified(request: HttpRequest, etag: str) -> bool:
    offered = request.headers.get("If-None-Match", "")
    return any(tag.strip() in (etag, f"W/{etag}", "*") for tag in offered.split(","))


@router.get("/gates", response={200: page_of(GateOut), **COMMON_ERRORS})
def list_gates(request: HttpRequest, filters: Query[GateFilters]):
    require(request, Perm.VIEW)
    gates = limit_to_sources(request, Gate.objects.select_related("source"))
    if filters.source is not None:
        gates = gates.filter(source__name=filters.source)
    if filters.open is not None:
        admitting = Q(state__in=ADMITTING_STATES)
        gates = gates.filter(admitting if filters.open else ~admitting)
    return paginate(gates.order_by("source__name", "namespace"), filters, serialize_gate)


@router.get(
    "/gates/{source}/{namespace}",
    response={200: GateOut, 304: None, **COMMON_ERRORS},
)
def get_gate(request: HttpRequest, response: HttpResponse, source: str, namespace: str):
    """Open or closed, the verified policy version, the active refresh and why it is closed.

    Send the previous `ETag` in `If-None-Match` to get an empty 304 while nothing changed.
    A namespace the source has seen but never refreshed is open with no verified version.
    """
    require(request, Perm.VIEW)
    found = source_or_404(request, source)
    gate = Gate.objects.filter(source=found, namespace=namespace).first()
    if gate is None:
        if not found.workers.filter(namespace=namespace).exists():
            raise Http404(f"source {source!r} has no namespace {namespace!r}")
        revision = 0
    else:
        revision = gate.revision
    etag = etag_for(found.pk, namespace, revision)
    response["ETag"] = etag
    response["Cache-Control"] = CACHE_CONTROL
    if _not_modified(request, etag):
        return Status(304, None)
    if gate is None:
        return gate_state(found, namespace)
    gate.source = found
    return serialize_gate(gate)


@router.post(
    "/gates/{source}/{namespace}/force-reopen",
    response={200: GateOut, 409: ErrorOut, **COMMON_ERRORS},
    openapi_extra=idempotency.OPENAPI_PARAMETER,
)
def force_reopen(
    request: HttpRequest,
    response: HttpResponse,
    source: str,
    namespace: str,
    payload: ForceReopenIn,
):
    """Open a closed gate without verification, with a written reason (audited, notified)."""
    require(request, FORCE_REOPEN.perm)
    found = source_or_404(request, source)
    gate = Gate.objects.filter(source=found, namespace=namespace).first()
    if gate is None:
        raise Http404(f"no gate for {source}/{namespace}")

    def reopen():
        FORCE_REOPEN.run(gate, actor(request), ActionInput(reason=payload.reason))
        fresh = Gate.objects.select_related("source").get(pk=gate.pk)
        return 200, serialize_gate(fresh)

    return idempotency.run(request, response, reopen)
