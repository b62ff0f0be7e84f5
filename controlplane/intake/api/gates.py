"""The gate API rollout frameworks poll: is a scope open, at which verified policy version.

Built to be polled every second by many clients, with one indexed read of the database: the
token's grant and the gate come from Redis (`accounts.tokens.grant_for`, `refresh.gate_cache`),
the copy is used only at the revision the gate row has committed (`gate_cache.current`), the
`ETag` is that revision, and `If-None-Match` is answered with 304 before anything is rendered. A
gate missing from Redis (or about to lapse) is read from the database and its copy primed,
once per process at a time. `fast_gate` serves the same answers in front of Django.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from typing import Any, Literal

from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from ninja import Query, Router, Schema, Status
from ninja.responses import NinjaJSONEncoder
from pydantic import Field

from controlplane.accounts.roles import Perm
from controlplane.fleet.models import Source
from controlplane.intake.api import idempotency
from controlplane.intake.api.auth import (
    actor,
    limit_to_sources,
    require,
    source_or_404,
    token_source_ids,
)
from controlplane.intake.api.errors import COMMON_ERRORS, ErrorOut
from controlplane.intake.api.pagination import PageParams, page_of, paginate
from controlplane.refresh import gate_cache
from controlplane.refresh.gate_lags import with_lags
from controlplane.refresh.gates import gate_state, serialize_gate
from controlplane.refresh.intents.action_table import FORCE_REOPEN, ActionInput
from controlplane.refresh.models import ADMITTING_STATES, Gate
from controlplane.refresh.policy_lag import with_lag

router = Router(tags=["gates"])

CACHE_CONTROL = "private, no-cache"
JSON_CONTENT_TYPE = "application/json; charset=utf-8"


class InstanceVersionOut(Schema):
    instance_id: str
    key: str = ""
    version: Any = None


class ForcedOut(Schema):
    by: str
    at: str | None
    reason: str
    #: The admitted instances not verified at the version they serve, with that version.
    instances: list[InstanceVersionOut] = []


class AdmittedForcedOut(Schema):
    by: str
    at: str | None
    reason: str


class AdmittedOut(Schema):
    """One admitted instance, from the serving ledger."""

    instance_id: str
    key: str = ""
    #: The version it serves (its readback, or the version verified at).
    version: Any = None
    #: verified_refresh | verified_catch_up | reported | assumed | unknown
    evidence: str
    verified: bool
    #: verified | forced
    admission: str
    refresh_id: int | None = None
    quarantine_id: int | None = None
    since: str | None = None
    forced: AdmittedForcedOut | None = None


class VersionCountOut(Schema):
    version: Any = None
    #: Admitted instances serving it, and how many of them are verified at it.
    count: int
    verified: int


class DriftOut(Schema):
    key: str
    instance_id: str
    kind: str
    detail: str = ""


class PolicyLagOut(Schema):
    lineage: str = Field(description="the training run compared ('' when unnamed)")
    latest_step: int
    latest_version: Any
    latest_digest: str
    latest_published_at: str
    serving_version: Any = Field(
        None, description="the admitted version furthest behind; null when nothing is admitted"
    )
    serving_step: int | None = Field(
        None, description="its published step; null when that version was never published"
    )
    steps: int | None = Field(None, description="latest_step - serving_step; null: unknown")
    seconds: float | None = Field(
        None, description="time between the two publications; null: unknown"
    )
    max_lag_steps: int
    action: Literal["observe", "alert", "close"]
    exceeded: bool = Field(description="steps > max_lag_steps")


class GateOut(Schema):
    source: str
    namespace: str
    state: Literal["open", "open_mixed", "open_forced", "closed", "unverified", "unknown"]
    #: Rollouts are admitted: `open` (every admitted instance verified at one version),
    #: `open_mixed` (verified at several versions: pin) or `open_forced` (a person's decision).
    open: bool
    since: str | None
    reason: str
    #: What closed a closed gate: refresh | drift | stale_policy; "" otherwise.
    closure: str = ""
    forced: ForcedOut | None = None
    #: The one version every admitted instance serves; null when none or several.
    version: Any = None
    #: The versions the admitted instances serve, with counts.
    versions: list[VersionCountOut] = []
    #: The admitted instances, each with its version and evidence (the serving ledger's view);
    #: pin generations to them with `nvext.backend_instance_id`.
    admitted: list[AdmittedOut] = []
    admitted_count: int = 0
    #: Admitted instances serving another version than `verified_version` (a force-reopen
    #: admitted what they serve): a refresh or a rollback resolves it.
    disagreements: list[InstanceVersionOut] = []
    #: Deprecated (derived): the version the namespace was last verified at.
    verified_version: Any = None
    #: Deprecated (derived from `admitted`): the admitted instance ids verified at
    #: `verified_version`.
    verified_instances: list[str]
    verified_count: int
    unverified_count: int
    confirmed_at: str | None
    drift: list[DriftOut]
    drift_count: int
    #: While a staged refresh (waves, canary, named instances) runs: which instances serve
    #: which version (`from_version`, `to_version`, `wave`, `waves`, `serving_old`,
    #: `in_flight`, `verified_new`, `left_out`); `{}` otherwise.
    instance_sets: dict[str, Any]
    #: Workers a refresh's failure budget left out of the verified set, each with its reason.
    left_out: list[DriftOut]
    left_out_count: int
    active_refresh_id: int | None
    revision: int
    updated_at: str | None
    #: How far the admitted workers' policy is behind the trainer's latest published one
    #: (`checkpoint.ready` with a step, or `policy.published`); null when nothing was
    #: published for this namespace. docs/concepts/policy-lag.md.
    policy_lag: PolicyLagOut | None = None


class GateFilters(PageParams):
    source: str | None = Field(None, max_length=64)
    open: bool | None = None


class ForceReopenIn(Schema):
    reason: str = Field(min_length=1, max_length=2000)


def etag_for(source_id: int, namespace: str, revision: int, mark: int = 0) -> str:
    # crc32, not hash(): every web replica must compute the same tag for the same gate. The
    # policy mark moves the tag when the trainer publishes (the lag shown changes).
    return f'"{source_id}.{zlib.crc32(namespace.encode()):08x}.{revision}.{mark}"'


def not_modified(offered: str, etag: str) -> bool:
    """`If-None-Match` (as sent, possibly a list) names the current tag."""
    return any(tag.strip() in (etag, f"W/{etag}", "*") for tag in offered.split(","))


def _not_modified(request: HttpRequest, etag: str) -> bool:
    return not_modified(request.headers.get("If-None-Match", ""), etag)


def render_gate(payload: dict[str, Any]) -> bytes:
    """The endpoint's JSON for a serialised gate, shaped by `GateOut` as Ninja would."""
    return json.dumps(GateOut.model_validate(payload).model_dump(), cls=NinjaJSONEncoder).encode()


_rendered: dict[tuple[str, str], tuple[bytes, bytes]] = {}
_RENDERED_MAX = 4096


def rendered_copy(source: str, namespace: str, cached: gate_cache.CachedGate) -> bytes:
    """`render_gate` of a Redis copy, remembered per gate until the copy's bytes change."""
    key = (source, namespace)
    seen = _rendered.get(key)
    if seen is not None and seen[0] == cached.body:
        return seen[1]
    body = render_gate(cached.payload())
    if len(_rendered) >= _RENDERED_MAX:
        _rendered.clear()
    _rendered[key] = (cached.body, body)
    return body


#: One database read per gate and process at a time when its copy is missing (it expired, or
#: a change is being committed): the other requests for it wait and then read the new copy.
_PRIMING = [threading.Lock() for _ in range(64)]


def _priming_lock(source: str, namespace: str) -> threading.Lock:
    return _PRIMING[zlib.crc32(f"{source}/{namespace}".encode()) % len(_PRIMING)]


@router.get("/gates", response={200: page_of(GateOut), **COMMON_ERRORS})
def list_gates(request: HttpRequest, filters: Query[GateFilters]):
    require(request, Perm.VIEW)
    gates = limit_to_sources(request, Gate.objects.select_related("source"))
    if filters.source is not None:
        gates = gates.filter(source__name=filters.source)
    if filters.open is not None:
        admitting = Q(state__in=ADMITTING_STATES)
        gates = gates.filter(admitting if filters.open else ~admitting)
    page = paginate(gates.order_by("source__name", "namespace"), filters, lambda gate: gate)
    # The page's lags together: a few reads per source rather than a few per gate.
    return {**page, "items": with_lags(page["items"])}


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
    cached = _visible_copy(request, source, namespace)
    priming = _priming_lock(source, namespace)
    if cached is not None and cached.due(time.time()) and priming.acquire(blocking=False):
        try:  # about to lapse: this request rebuilds it, the others go on reading it
            return _from_database(request, response, source, namespace)
        finally:
            priming.release()
    if cached is None:
        with priming:
            cached = _visible_copy(request, source, namespace)
            if cached is None:
                return _from_database(request, response, source, namespace)
    etag = etag_for(cached.source_id, namespace, cached.revision, cached.mark)
    if _not_modified(request, etag):
        answer = HttpResponse(status=304)
    else:
        answer = HttpResponse(
            rendered_copy(source, namespace, cached), content_type=JSON_CONTENT_TYPE
        )
    answer["ETag"] = etag
    answer["Cache-Control"] = CACHE_CONTROL
    return answer


def _visible_copy(request: HttpRequest, source: str, namespace: str):
    """The gate's Redis copy if the caller may see its source (else the database decides)."""
    cached = gate_cache.read(source, namespace)
    limit = token_source_ids(request)
    if cached is None or (limit is not None and cached.source_id not in limit):
        return None
    # Only a copy at the revision the database has committed now: a close committed by a
    # writer whose copy never reached this Redis is answered from the row (gate_cache.py).
    return gate_cache.current(cached, source, namespace)


def _serialized(found: Source, namespace: str) -> dict[str, Any] | None:
    """The gate as the database has it; None when the source has no such namespace."""
    gate = Gate.objects.filter(source=found, namespace=namespace).first()
    if gate is None:
        if not found.workers.filter(namespace=namespace).exists():
            return None
        return with_lag(gate_state(found, namespace), found)
    gate.source = found
    return with_lag(serialize_gate(gate), found)


def rebuild_copy(source: str, namespace: str) -> None:
    """Rebuild a gate's Redis copy from the database, unless this process is already at it
    (`fast_gate` calls this in the background when a copy is about to lapse)."""
    priming = _priming_lock(source, namespace)
    if not priming.acquire(blocking=False):
        return
    try:
        found = Source.objects.filter(name=source).first()
        payload = _serialized(found, namespace) if found is not None else None
        if found is not None and payload is not None:
            gate_cache.prime(payload, found.pk)
    finally:
        priming.release()


def _from_database(request: HttpRequest, response: HttpResponse, source: str, namespace: str):
    found = source_or_404(request, source)
    payload = _serialized(found, namespace)
    if payload is None:
        raise Http404(f"source {source!r} has no namespace {namespace!r}")
    gate_cache.prime(payload, found.pk)
    etag = etag_for(found.pk, namespace, payload["revision"], payload["policy_mark"])
    response["ETag"] = etag
    response["Cache-Control"] = CACHE_CONTROL
    if _not_modified(request, etag):
        return Status(304, None)
    return payload


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
        return 200, with_lag(serialize_gate(fresh), fresh.source)

    return idempotency.run(request, response, reopen)
