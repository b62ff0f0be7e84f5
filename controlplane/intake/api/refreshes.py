"""Policy refreshes: plan, start, read (with plan, steps and journal), approve, reject, abort,
retry, roll back and end. Every action runs through its row of `refresh.action_table`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.db.models import F
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from ninja import Path, Query, Router, Schema
from pydantic import Field, StrictBool, WithJsonSchema

from controlplane import jobs
from controlplane.accounts.roles import Perm
from controlplane.intake.api import idempotency, waiting
from controlplane.intake.api.auth import actor, limit_to_sources, require, source_or_404
from controlplane.intake.api.errors import COMMON_ERRORS, ApiError, ErrorOut
from controlplane.intake.api.pagination import PageParams, page_of, paginate
from controlplane.intake.fingerprint import FingerprintIn
from controlplane.intake.strategy import STRATEGY_SCHEMA, StrategyRefused, checked
from controlplane.refresh import canary_review, intents, reconcile
from controlplane.refresh.eta import eta_json
from controlplane.refresh.intents import action_table, external
from controlplane.refresh.intents.action_table import Action, ActionInput
from controlplane.refresh.models import PolicyRefresh
from controlplane.refresh.progress import external_of
from controlplane.refresh.strategy import stored as stored_strategy

router = Router(tags=["policy refreshes"])

Id = Annotated[int, Path(ge=1, le=2**63 - 1)]
ACTION_ERRORS = {409: ErrorOut, **COMMON_ERRORS}
#: The refresh detail's `journal` holds the refresh's first calls up to this many; its
#: `journal_url` pages through every call (a refresh of 2,000 workers makes about 12,000).
JOURNAL_LIMIT = 5000


class LoraIn(Schema):
    action: Literal["load", "unload", "swap"] = "load"
    lora_name: str = Field(min_length=1, max_length=200)
    uri: str | None = Field(None, max_length=2000)


class TargetIn(Schema):
    weight_version: str | int = Field(description="the policy version workers must report")
    method: Literal["disk", "distributed", "lora", "tensor", "custom", "external"] = "disk"
    model_path: str | None = Field(None, max_length=1000, description="disk")
    group: dict[str, Any] | None = Field(
        None,
        description="distributed: master_address, master_port, group_name, ... (never ranks: "
        "the plan assigns rank_offset and world_size per worker)",
    )
    update: dict[str, Any] | None = Field(None, description="distributed or tensor")
    trainer_ranks: int | None = Field(None, ge=1, le=1_000_000, description="distributed")
    init_timeout_s: float | None = Field(None, gt=0, le=3600, description="distributed")
    broadcast_timeout_s: float | None = Field(None, gt=0, le=86400, description="distributed")
    apply_timeout_s: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="external: how long the paused workers wait for the trainer's applied "
        "report before the refresh holds (default REFRESH_APPLY_TIMEOUT_SECONDS)",
    )
    lora: LoraIn | None = None
    route: str | None = Field(None, max_length=300, description="custom: an allowlisted route")
    body: dict[str, Any] | None = Field(None, description="custom: the route's body")


class PlanIn(Schema):
    source: str = Field(max_length=64)
    target: TargetIn
    namespaces: list[Annotated[str, Field(max_length=200)]] | None = Field(None, max_length=100)
    worker_ids: list[Annotated[int, Field(ge=1, le=2**63 - 1)]] | None = Field(
        None, max_length=10000
    )
    pause_mode: Literal[
        "auto", "keep", "wait", "abort", "retract", "in_place", "release_memory"
    ] = Field("auto", description="auto = each family's default; a family refuses modes it lacks")
    pause_modes: dict[str, str] | None = Field(
        None, description='per-family pause modes, e.g. {"sglang": "retract"}'
    )
    inflight_may_straddle: bool = Field(
        False,
        description="declare that requests in flight may continue on the new weights; a pause "
        "mode that keeps them (keep, retract, in_place) is refused (422) without it",
    )
    versions: dict[str, str] | None = Field(
        None, description="declared versions for the compatibility record (dynamo, vllm, ...)"
    )
    verification: dict[str, Any] | None = None
    fingerprint: FingerprintIn | None = Field(
        None,
        description="the trainer's fingerprint of the new policy; every worker must match it",
    )
    strategy: Annotated[dict[str, Any], WithJsonSchema(STRATEGY_SCHEMA)] | None = Field(
        None,
        description="how the refresh walks its scope; omitted: the source's default strategy. "
        "A strategy that does not validate is answered 400 with field errors.",
    )
    instances: list[Annotated[str, Field(pattern=r"^\d{1,20}$")]] | None = Field(
        None,
        max_length=10000,
        description="refresh only these instance ids of the scope; the rest keep serving",
    )


class RejectIn(Schema):
    reason: str = Field(min_length=1, max_length=2000)


class AbortIn(Schema):
    resume_engines: bool = False


class BroadcastDoneIn(Schema):
    weight_version: str | int | None = Field(
        None, description="the version the trainer broadcast; refused if not the refresh's"
    )
    attempt: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="the handshake attempt broadcast to (`group.attempt` from "
        "`refresh.group_ready` or GET …/group); 409 for an earlier attempt. Needed once the "
        "group was formed again (attempt 2 on)",
    )


class GroupOut(Schema):
    refresh_id: int
    refresh_state: str
    state: str
    attempt: int | None = Field(None, description="which formation of the group this is")
    world_size: int | None = None
    trainer_ranks: int | None = None
    ranks: dict[str, list[int]]
    weight_version: Any = None
    ready_at: str | None = None
    broadcast_done_at: str | None = None
    broadcast_done_by: str | None = None
    destroyed_at: str | None = None
    reason: str


class GroupWait(Schema):
    wait: float = Field(0, ge=0, le=60, description="seconds to wait for the group to move")
    after: str | None = Field(
        None, max_length=32, description="answer once the group state is no longer this one"
    )


class CanaryVerdictIn(Schema):
    weight_version: str | int = Field(
        description="the version the trainer evaluated; refused (409) if not the refresh's"
    )
    passed: StrictBool = Field(description="true: the rest of the scope follows")
    metrics: dict[str, Any] = Field(
        default_factory=dict, description="what the evaluation measured (kept and audited)"
    )
    reason: str = Field("", max_length=2000, description="optional; shown with a failure")


InstanceId = Annotated[str, Field(pattern=r"^\d{1,20}$")]


class AppliedIn(Schema):
    weight_version: str | int = Field(
        description="the version the trainer applied; refused (409) if not the refresh's"
    )
    instance_ids: list[InstanceId] | None = Field(
        None,
        max_length=10000,
        description="the announced workers it applied to (omitted: all of them); 409 for an "
        "instance the refresh did not announce",
    )


class ApplyWorkerOut(Schema):
    instance_id: str
    namespace: str
    key: str
    family: str
    system_url: str = Field(description="the worker's admin URL (its system server)")


class ExternalOut(Schema):
    """An external update's wait for the trainer's `applied` report."""

    refresh_id: int
    refresh_state: str
    weight_version: Any = None
    state: str = Field(description="awaiting, applied, expired, aborted; empty before any")
    attempt: int | None = Field(None, description="which announcement (1, then per retry)")
    requested_at: str | None = None
    deadline: str | None = Field(None, description="past it without every report, it holds")
    workers: list[ApplyWorkerOut]
    applied: list[str] = Field(description="instance ids (or keys) that reported applied")
    missing: list[str] = Field(description="instance ids (or keys) still to report")
    reason: str


class EndIn(Schema):
    reason: str = Field(min_length=1, max_length=2000)


class ForceReopenNamespaceIn(Schema):
    namespace: str = Field(min_length=1, max_length=200)
    reason: str = Field(min_length=1, max_length=2000)


class RefreshOut(Schema):
    id: int
    source: str
    namespaces: list[str]
    target: dict[str, Any]
    state: str
    pause_mode: str
    pause_modes: dict[str, str] = {}
    inflight_may_straddle: bool = False
    group: dict[str, Any] = {}
    compat: dict[str, Any] = {}
    fingerprint: dict[str, Any] | None = None
    strategy: dict[str, Any] = Field(
        default_factory=dict,
        description="the strategy it was planned with (the `strategy` JSON form, kind always "
        "given) and `description`, one line saying what it does",
    )
    instances: list[str] | None = Field(
        None, description="only these instance ids are refreshed (null = the whole scope)"
    )
    wave: int = Field(1, description="the wave being run, from 1")
    waves: int = Field(1, description="how many waves the plan has")
    canary: dict[str, Any] | None = Field(
        None,
        description="a canary's evaluation: state (awaiting, passed, failed), instances by "
        "namespace, deadline, verdict, metrics, by, at",
    )
    external: dict[str, Any] | None = Field(
        None,
        description="an external update's wait for the trainer (as GET …/external answers); "
        "null before its first ready_for_apply",
    )
    plan_blockers: list[Any]
    failed_step: str
    held_reason: str
    end_reason: str
    requested_by: str
    approved_by: str | None
    rollback_of: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class PlannedWorkerOut(Schema):
    key: str
    namespace: str
    instance_id: str
    family: str
    system_url: str
    calls: dict[str, Any]
    blockers: list[Any]
    flush_skipped: str
    update_method: str
    method_reason: str
    pause_mode: str
    rank_offset: int | None = None
    ranks: int | None = None


class StepOut(Schema):
    name: str
    attempt: int
    status: str
    detail: str
    started_at: datetime
    finished_at: datetime | None
    duration_ms: float | None


class JournalOut(Schema):
    id: int
    worker: str | None
    step: str
    operation: str
    method: str
    url: str
    request_body: Any = None
    http_status: int | None
    response_body: Any = None
    ok: bool
    error: str
    duration_ms: float
    attempt: int
    started_at: datetime
    finished_at: datetime


class EtaOut(Schema):
    """When a running refresh should end, as its page shows it (`refresh.eta`)."""

    estimated_end: datetime | None = Field(description="null when there is no estimate")
    remaining_seconds: float | None
    basis: str | None = Field(
        description='what it rests on: "per-step medians of the last N successful refreshes '
        'of this source"'
    )
    history: int | None = Field(description="N: how many past successful refreshes")
    reason: str | None = Field(
        description="why there is no estimate (no successful refresh of the source yet, or "
        "the refresh is not running its steps); null when there is one"
    )


class RefreshDetailOut(RefreshOut):
    capacity_url: str = Field(description="its capacity and goodput (paused time, gated time)")
    journal_url: str = Field(
        description="every call of its journal, oldest first, a page at a time"
    )
    eta: EtaOut = Field(description="its estimated end while it runs its steps")
    workers: list[PlannedWorkerOut]
    steps: list[StepOut]
    journal: list[JournalOut] = Field(
        description=f"its first {JOURNAL_LIMIT:,} calls, oldest first (`journal_url`: all)"
    )


class JournalFilters(PageParams):
    step: str | None = Field(None, max_length=24, description="only this step's calls")
    ok: bool | None = Field(None, description="only the calls that succeeded (or failed)")


class RefreshFilters(PageParams):
    source: str | None = Field(None, max_length=64)
    state: str | None = Field(None, max_length=24)


def strategy_out(refresh) -> dict[str, Any]:
    strategy = stored_strategy(refresh)
    return {**strategy.to_dict(), "description": strategy.describe()}


def serialize_refresh(refresh) -> dict[str, Any]:
    return {
        "id": refresh.pk,
        "source": refresh.source.name,
        "namespaces": list(refresh.namespaces or []),
        "target": refresh.target if isinstance(refresh.target, dict) else {},
        "state": refresh.state,
        "pause_mode": refresh.pause_mode,
        "pause_modes": refresh.pause_modes or {},
        "inflight_may_straddle": refresh.inflight_may_straddle,
        "group": refresh.group or {},
        "compat": refresh.compat or {},
        "fingerprint": refresh.fingerprint,
        "strategy": strategy_out(refresh),
        "instances": refresh.instances,
        "wave": refresh.wave,
        "waves": refresh.waves,
        "canary": canary_review.review(refresh),
        "external": external.public_view(refresh) if external_of(refresh) else None,
        "plan_blockers": list(refresh.plan_blockers or []),
        "failed_step": refresh.failed_step,
        "held_reason": refresh.held_reason,
        "end_reason": refresh.end_reason,
        "requested_by": refresh.requested_by_label,
        "approved_by": refresh.approved_by.get_username() if refresh.approved_by_id else None,
        "rollback_of": refresh.rollback_of_id,
        "created_at": refresh.created_at,
        "started_at": refresh.started_at,
        "finished_at": refresh.finished_at,
    }


def eta_out(refresh) -> dict[str, Any]:
    """The estimate in the API's JSON form (times as ISO 8601), for the API and the CLI."""
    return EtaOut.model_validate(eta_json(refresh)).model_dump(mode="json")


def _calls(refresh):
    """The refresh's journal with each call's worker key (not the planned worker's row, whose
    planned calls a page of 500 calls would otherwise read with every one)."""
    return refresh.journal.annotate(worker_key=F("planned_worker__key"))


def serialize_call(call) -> dict[str, Any]:
    return {
        **{f: getattr(call, f) for f in JournalOut.model_fields if f != "worker"},
        "worker": call.worker_key,
    }


def serialize_detail(refresh) -> dict[str, Any]:
    journal = _calls(refresh).order_by("id")[:JOURNAL_LIMIT]
    return {
        **serialize_refresh(refresh),
        "capacity_url": reverse("intake:api-v1:get_refresh_capacity", args=[refresh.pk]),
        "journal_url": reverse("intake:api-v1:list_refresh_journal", args=[refresh.pk]),
        "eta": eta_out(refresh),
        "workers": [
            {f: getattr(w, f) for f in PlannedWorkerOut.model_fields} for w in refresh.workers.all()
        ],
        "steps": [{f: getattr(s, f) for f in StepOut.model_fields} for s in refresh.steps.all()],
        "journal": [serialize_call(j) for j in journal],
    }


def _refresh_or_404(request: HttpRequest, refresh_id: int):
    refreshes = limit_to_sources(
        request,
        PolicyRefresh.objects.select_related("source", "approved_by"),
    )
    return get_object_or_404(refreshes, pk=refresh_id)


def _json(data: dict[str, Any]) -> dict[str, Any]:
    return RefreshOut.model_validate(data).model_dump(mode="json")


@router.get("/refreshes", response={200: page_of(RefreshOut), **COMMON_ERRORS})
def list_refreshes(request: HttpRequest, filters: Query[RefreshFilters]):
    require(request, Perm.VIEW)
    refreshes = limit_to_sources(
        request,
        canary_review.with_runs(PolicyRefresh.objects.select_related("source", "approved_by")),
    )
    if filters.source is not None:
        refreshes = refreshes.filter(source__name=filters.source)
    if filters.state is not None:
        refreshes = refreshes.filter(state=filters.state)
    return paginate(refreshes.order_by("-id"), filters, serialize_refresh)


@router.post(
    "/refreshes",
    response={201: RefreshOut, **ACTION_ERRORS},
    openapi_extra=idempotency.OPENAPI_PARAMETER,
)
def plan_refresh(request: HttpRequest, response: HttpResponse, payload: PlanIn):
    """Plan a policy refresh (runs a fresh discovery first). Nothing is touched until start.

    `strategy` chooses all at once, waves or a canary first (omitted: the source's default);
    the answer's `strategy` is the one stored, with a one-line `description`."""
    require(request, Perm.OPERATE_REFRESH)
    source = source_or_404(request, payload.source)
    strategy = None
    if payload.strategy is not None:
        try:
            strategy = checked(payload.strategy).to_dict()
        except StrategyRefused as exc:
            raise ApiError(400, "invalid_strategy", str(exc), exc.errors) from None

    def plan():
        refresh = intents.plan_policy_refresh(
            source=source,
            actor=actor(request),
            target=payload.target.model_dump(exclude_none=True),
            namespaces=payload.namespaces,
            worker_ids=payload.worker_ids,
            pause_mode=payload.pause_mode,
            pause_modes=payload.pause_modes,
            inflight_may_straddle=payload.inflight_may_straddle,
            versions=payload.versions,
            verification=payload.verification,
            fingerprint=payload.fingerprint.as_dict() if payload.fingerprint else None,
            strategy=strategy,
            instances=payload.instances,
        )
        return 201, _json(serialize_refresh(refresh))

    return idempotency.run(request, response, plan)


@router.get("/refreshes/{refresh_id}", response={200: RefreshDetailOut, **COMMON_ERRORS})
def get_refresh(request: HttpRequest, refresh_id: Id):
    """One refresh with its stored plan, its steps and its call journal."""
    require(request, Perm.VIEW)
    return serialize_detail(_refresh_or_404(request, refresh_id))


@router.get("/refreshes/{refresh_id}/journal", response={200: page_of(JournalOut), **COMMON_ERRORS})
def list_refresh_journal(request: HttpRequest, refresh_id: Id, filters: Query[JournalFilters]):
    """Every call of one refresh's journal, oldest first, a page at a time (`limit`,
    `offset`, as every list of the API); `step` and `ok` narrow it. Each call with its whole
    request and response bodies, as stored."""
    require(request, Perm.VIEW)
    calls = _calls(_refresh_or_404(request, refresh_id))
    if filters.step is not None:
        calls = calls.filter(step=filters.step)
    if filters.ok is not None:
        calls = calls.filter(ok=filters.ok)
    return paginate(calls.order_by("id"), filters, serialize_call)


@router.get(
    "/refreshes/{refresh_id}/journal/{call_id}", response={200: JournalOut, **COMMON_ERRORS}
)
def get_refresh_call(request: HttpRequest, refresh_id: Id, call_id: Id):
    """One call of a refresh's journal with its whole bodies. The refresh page shows a long
    body cut short (a fleet-wide call's lists every worker) and links here."""
    require(request, Perm.VIEW)
    refresh = _refresh_or_404(request, refresh_id)
    return serialize_call(get_object_or_404(_calls(refresh), pk=call_id))


class ActionOut(RefreshOut):
    queued: bool = Field(
        True,
        description="whether the work this action started (the executor, for a start, approve, "
        "retry or rollback) reached the task queue; true when it started none. false: the "
        "change is committed all the same, and `recovery` says what runs it and within when",
    )
    recovery: str | None = Field(None, description="when `queued` is false: how it is recovered")


def _queueing(sends: jobs.Sends) -> dict[str, Any]:
    if sends.all_sent:
        return {"queued": True, "recovery": None}
    within = reconcile.resend_within_seconds()
    return {
        "queued": False,
        "recovery": f"the task queue was unavailable; the reconciler enqueues the refresh "
        f"within {within:.0f} s of the queue's return",
    }


def _action(
    request: HttpRequest,
    response: HttpResponse,
    refresh_id: int,
    action: Action[PolicyRefresh],
    given: ActionInput | None = None,
):
    require(request, action.perm)
    refresh = _refresh_or_404(request, refresh_id)

    def act():
        # The action commits before its tasks are sent: a broker outage never turns a
        # committed change into an error answer, it is said in `queued` and `recovery`.
        with jobs.tracking() as sends:
            result = action.run(refresh, actor(request), given or ActionInput())
        result.refresh_from_db()
        body = ActionOut.model_validate({**serialize_refresh(result), **_queueing(sends)})
        return (201 if result.pk != refresh.pk else 200), body.model_dump(mode="json")

    return idempotency.run(request, response, act)


def _action_route(action: Action[PolicyRefresh]):
    """The POST route of one action: `/refreshes/{id}/<name>`, idempotent, same answers."""
    return router.post(
        f"/refreshes/{{refresh_id}}/{action.name}",
        response={200: ActionOut, 201: ActionOut, **ACTION_ERRORS},
        openapi_extra=idempotency.OPENAPI_PARAMETER,
    )


@_action_route(action_table.START)
def start_refresh(request: HttpRequest, response: HttpResponse, refresh_id: Id):
    """Start a planned refresh; it waits for approval if its source requires one."""
    return _action(request, response, refresh_id, action_table.START)


@_action_route(action_table.APPROVE)
def approve_refresh(request: HttpRequest, response: HttpResponse, refresh_id: Id):
    return _action(request, response, refresh_id, action_table.APPROVE)


@_action_route(action_table.REJECT)
def reject_refresh(request: HttpRequest, response: HttpResponse, refresh_id: Id, payload: RejectIn):
    given = ActionInput(reason=payload.reason)
    return _action(request, response, refresh_id, action_table.REJECT, given)


@_action_route(action_table.ABORT)
def abort_refresh(
    request: HttpRequest, response: HttpResponse, refresh_id: Id, payload: AbortIn | None = None
):
    given = ActionInput(resume_engines=payload.resume_engines if payload else False)
    return _action(request, response, refresh_id, action_table.ABORT, given)


@_action_route(action_table.RETRY)
def retry_refresh(request: HttpRequest, response: HttpResponse, refresh_id: Id):
    """Retry the failed step of a held refresh (only failed or unreached workers)."""
    return _action(request, response, refresh_id, action_table.RETRY)


@_action_route(action_table.ROLLBACK)
def rollback_refresh(request: HttpRequest, response: HttpResponse, refresh_id: Id):
    """Plan a new refresh back to the last verified policy (answers 201 with the new one)."""
    return _action(request, response, refresh_id, action_table.ROLLBACK)


@_action_route(action_table.END)
def end_refresh(request: HttpRequest, response: HttpResponse, refresh_id: Id, payload: EndIn):
    """Close a refresh out with a written reason, calling no worker: it ends `aborted`, its
    scope is free at once and its gates stay closed. A running refresh is aborted first."""
    given = ActionInput(reason=payload.reason)
    return _action(request, response, refresh_id, action_table.END, given)


@_action_route(action_table.RESOLVE_MEMBERSHIP)
def resolve_refresh_membership(request: HttpRequest, response: HttpResponse, refresh_id: Id):
    """Resolve a hold on a membership change: drop the workers that left (or changed), leave
    the joiners out of the verified set, then run the held step again (the reopen re-reads
    discovery and opens for the verified set)."""
    return _action(request, response, refresh_id, action_table.RESOLVE_MEMBERSHIP)


@_action_route(action_table.REOPEN_VERIFIED)
def reopen_verified_namespaces(request: HttpRequest, response: HttpResponse, refresh_id: Id):
    """Open every namespace of a held refresh whose workers all passed verify (state `open`,
    with the verified set); the others stay closed and the refresh stays held for them."""
    return _action(request, response, refresh_id, action_table.REOPEN_VERIFIED)


@_action_route(action_table.FORCE_REOPEN_NAMESPACE)
def force_reopen_refresh_namespace(
    request: HttpRequest, response: HttpResponse, refresh_id: Id, payload: ForceReopenNamespaceIn
):
    """Force-reopen one namespace of a held refresh (`open_forced`, with the reason); its
    engines are resumed and the refresh goes on held for its other namespaces."""
    given = ActionInput(reason=payload.reason, namespace=payload.namespace)
    return _action(request, response, refresh_id, action_table.FORCE_REOPEN_NAMESPACE, given)


@_action_route(action_table.BROADCAST_DONE)
def report_broadcast_done(
    request: HttpRequest,
    response: HttpResponse,
    refresh_id: Id,
    payload: BroadcastDoneIn | None = None,
):
    """The trainer broadcast the new weights to the group (after `refresh.group_ready`): the
    workers now apply them. 409 unless the refresh is waiting for exactly this: the group is
    ready, the version is the refresh's, and `attempt` is the group's (a report for an earlier
    formation of the group is refused and audited)."""
    given = ActionInput(
        weight_version=payload.weight_version if payload else None,
        attempt=payload.attempt if payload else None,
    )
    return _action(request, response, refresh_id, action_table.BROADCAST_DONE, given)


@_action_route(action_table.CANARY_VERDICT)
def record_canary_verdict(
    request: HttpRequest, response: HttpResponse, refresh_id: Id, payload: CanaryVerdictIn
):
    """The trainer's verdict on a canary waiting in `canary_review` (after the
    `refresh.canary_review` notification, which names the canary's verified instances): passed,
    the rest of the scope follows; failed, the canary is rolled back and the refresh holds.
    The same verdict again changes nothing; 409 when no canary waits, the other verdict was
    already given, or `weight_version` is not the refresh's, and 409
    `canary_not_trainer_judged` (audited, nothing changes) when the canary's strategy does not
    say `evaluation: trainer`: a `manual` canary is approved or rejected by a person."""
    given = ActionInput(
        passed=payload.passed,
        metrics=payload.metrics,
        reason=payload.reason,
        weight_version=payload.weight_version,
    )
    return _action(request, response, refresh_id, action_table.CANARY_VERDICT, given)


@_action_route(action_table.APPLIED)
def report_applied(
    request: HttpRequest, response: HttpResponse, refresh_id: Id, payload: AppliedIn
):
    """The trainer's framework applied the new weights itself (after
    `refresh.ready_for_apply`, which names the paused workers): for `instance_ids`, or for
    every announced worker when omitted. Once all of them reported, the refresh declares the
    version (`set_weight_version` where advertised), reads it back, flushes, verifies and
    reopens. A report already recorded changes nothing. 409 (audited, nothing changes):
    `weight_version_mismatch` for another version, `instance_not_in_refresh` for an instance
    it did not announce, `not_awaiting_apply` when the refresh waits for no report."""
    given = ActionInput(weight_version=payload.weight_version, instance_ids=payload.instance_ids)
    return _action(request, response, refresh_id, action_table.APPLIED, given)


@router.get("/refreshes/{refresh_id}/external", response={200: ExternalOut, **COMMON_ERRORS})
def get_refresh_external(request: HttpRequest, refresh_id: Id):
    """An external update's wait for the trainer: the paused workers to apply to (instance
    ids, namespaces, admin URLs), the deadline, and who reported `applied`. `state` is
    `awaiting` while the refresh (`refresh_state` `awaiting_apply`) waits for the report."""
    require(request, Perm.VIEW)
    return external.public_view(_refresh_or_404(request, refresh_id))


@router.get(
    "/refreshes/{refresh_id}/group", response={200: GroupOut, 429: ErrorOut, **COMMON_ERRORS}
)
async def get_refresh_group(request: HttpRequest, refresh_id: Id, params: Query[GroupWait]):
    """A distributed refresh's group: its rank map and where the trainer handshake stands
    (`joining`, `ready`, `broadcast_done`, `applying`, `destroyed`, `torn_down`). With `wait`,
    a long poll: answers once the state is no longer `after` (or when `wait` runs out). A long
    poll holds no database connection while it waits; past the server's bound on concurrent
    waits (per token and per process) it is answered 429 with `Retry-After`."""
    return await waiting.group_long_poll(request, refresh_id, params.wait, params.after)
