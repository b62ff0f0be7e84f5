"""Workers (with filters) and observations (discovery runs)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Path, Query, Router, Schema
from pydantic import Field

from controlplane.accounts.roles import Perm
from controlplane.fleet.models import DiscoveryRun, Worker
from controlplane.intake.api.auth import limit_to_sources, require
from controlplane.intake.api.errors import COMMON_ERRORS
from controlplane.intake.api.pagination import PageParams, page_of, paginate

router = Router(tags=["workers"])

Id = Annotated[int, Path(ge=1, le=2**63 - 1)]


class WorkerOut(Schema):
    id: int
    source: str
    namespace: str
    component: str
    endpoint: str
    # A string: Dynamo instance ids are u64 and often exceed what JSON numbers carry exactly.
    instance_id: str
    family: str
    model: str
    routes: list[Any]
    system_url: str
    world_size: int | None
    state: str
    error: str
    weight_version: Any = None
    version_error: str
    liveness: str
    liveness_error: str
    is_static: bool
    first_seen_at: datetime
    last_seen_at: datetime
    gone_at: datetime | None
    last_probed_at: datetime | None


class WorkerFilters(PageParams):
    source: str | None = Field(None, max_length=64)
    namespace: str | None = Field(None, max_length=200)
    component: str | None = Field(None, max_length=200)
    state: Literal["live", "erroring", "gone"] | None = None
    family: str | None = Field(None, max_length=32)
    instance_id: str | None = Field(None, max_length=20)


class DiscoveryRunOut(Schema):
    id: int
    source: str
    trigger: str
    started_at: datetime
    finished_at: datetime | None
    duration_ms: float | None
    ok: bool
    error: str
    reported_namespace: str
    workers_total: int
    workers_live: int
    workers_erroring: int
    joined: int
    left: int
    changed: int
    rejected_entries: list[Any]


class RunFilters(PageParams):
    source: str | None = Field(None, max_length=64)
    ok: bool | None = None


def serialize_worker(worker: Worker) -> dict:
    return {
        **{f: getattr(worker, f) for f in WorkerOut.model_fields if hasattr(worker, f)},
        "source": worker.source.name,
        "routes": worker.routes if isinstance(worker.routes, list) else [],
    }


def serialize_run(run: DiscoveryRun) -> dict:
    return {
        **{f: getattr(run, f) for f in DiscoveryRunOut.model_fields},
        "source": run.source.name,
        "rejected_entries": run.rejected_entries if isinstance(run.rejected_entries, list) else [],
    }


@router.get("/workers", response={200: page_of(WorkerOut), **COMMON_ERRORS})
def list_workers(request: HttpRequest, filters: Query[WorkerFilters]):
    require(request, Perm.VIEW)
    workers = limit_to_sources(request, Worker.objects.select_related("source"))
    for field in ("namespace", "component", "state", "family", "instance_id"):
        if (value := getattr(filters, field)) is not None:
            workers = workers.filter(**{field: value})
    if filters.source is not None:
        workers = workers.filter(source__name=filters.source)
    return paginate(workers.order_by("source__name", "namespace", "id"), filters, serialize_worker)


@router.get("/workers/{worker_id}", response={200: WorkerOut, **COMMON_ERRORS})
def get_worker(request: HttpRequest, worker_id: Id):
    require(request, Perm.VIEW)
    workers = limit_to_sources(request, Worker.objects.select_related("source"))
    return serialize_worker(get_object_or_404(workers, pk=worker_id))


@router.get("/observations", response={200: page_of(DiscoveryRunOut), **COMMON_ERRORS})
def list_observations(request: HttpRequest, filters: Query[RunFilters]):
    """Discovery runs, newest first: what each poll of a listener saw."""
    require(request, Perm.VIEW)
    runs = limit_to_sources(request, DiscoveryRun.objects.select_related("source"))
    if filters.source is not None:
        runs = runs.filter(source__name=filters.source)
    if filters.ok is not None:
        runs = runs.filter(ok=filters.ok)
    return paginate(runs.order_by("-started_at", "-id"), filters, serialize_run)


@router.get("/observations/{run_id}", response={200: DiscoveryRunOut, **COMMON_ERRORS})
def get_observation(request: HttpRequest, run_id: Id):
    require(request, Perm.VIEW)
    runs = limit_to_sources(request, DiscoveryRun.objects.select_related("source"))
    return serialize_run(get_object_or_404(runs, pk=run_id))
