"""A policy refresh's capacity: paused time per worker, engines running and workers admitted
per version over time, time gated per namespace (`refresh.capacity` says how each is derived).
Same reader and scope as the refresh itself."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Query, Router, Schema
from pydantic import Field

from controlplane.accounts.roles import Perm
from controlplane.intake.api.auth import limit_to_sources, require
from controlplane.intake.api.errors import COMMON_ERRORS
from controlplane.intake.api.pagination import PageParams, page_of
from controlplane.intake.api.refreshes import Id
from controlplane.refresh.capacity import SERIES_POINTS, capacity_of
from controlplane.refresh.models import PolicyRefresh

router = Router(tags=["policy refreshes"])


class CapacityIntervalOut(Schema):
    start: datetime
    end: datetime | None = Field(description="null: still open at the window's end")


class CapacityWindowOut(Schema):
    start: datetime
    end: datetime = Field(description="the refresh's end, or now while it is active or held")
    seconds: float
    ongoing: bool


class CapacityPausedSecondsOut(Schema):
    min: float | None
    median: float | None
    max: float | None


class CapacitySummaryOut(Schema):
    workers: int = Field(description="planned workers")
    paused_workers: int = Field(description="workers paused at least once")
    paused_at_end: int = Field(description="workers not resumed by the window's end")
    peak_unavailable: int
    peak_unavailable_at: datetime | None
    worker_seconds_paused: float
    min_serving_fraction: float | None = Field(description="lowest share with engines running")
    min_admitted_fraction: float | None = Field(
        description="lowest share running in a namespace whose gate admits rollouts"
    )
    mean_serving_fraction: float | None
    mean_admitted_fraction: float | None
    first_pause_at: datetime | None
    last_resume_at: datetime | None
    paused_seconds: CapacityPausedSecondsOut = Field(description="over the workers paused at all")


class CapacityPointOut(Schema):
    at: datetime = Field(description="holds until the next point, the last to the window's end")
    running: dict[str, int] = Field(description="engines running per version")
    paused: int
    admitted: int


class CapacityNamespaceOut(Schema):
    namespace: str
    gated_seconds: float
    gated_at_end: bool
    intervals: list[CapacityIntervalOut]


class CapacityWorkerOut(Schema):
    key: str
    namespace: str
    paused_seconds: float
    paused_at_end: bool
    version: str = Field(description="what it serves (or will serve once resumed)")
    intervals: list[CapacityIntervalOut]


CapacityWorkerPage = page_of(CapacityWorkerOut)


class CapacityOut(Schema):
    refresh_id: int
    state: str
    started: bool = Field(description="false: nothing measured yet (the rest is empty)")
    window: CapacityWindowOut | None = None
    versions: list[str] = Field([], description="series names, previous versions first")
    target_version: str | None = None
    summary: CapacitySummaryOut | None = None
    series: list[CapacityPointOut] = Field(
        [],
        description=f"every change while there are at most {SERIES_POINTS}; beyond, one point "
        "per equal slice of the window with the slice's worst moment (most paused, fewest "
        "admitted), so the series stays bounded at any fleet size",
    )
    series_exact: bool = Field(True, description="false: `series` is the bounded one")
    namespaces: list[CapacityNamespaceOut] = []
    workers: CapacityWorkerPage = Field(  # type: ignore[valid-type]  # built at run time
        description="one page of the planned workers by namespace and key (`limit`, "
        "`offset`: 50 by default, 500 at most); `count` is every planned worker"
    )


def capacity_json(refresh, page: PageParams) -> dict[str, Any]:
    cap = capacity_of(refresh)
    head = {"refresh_id": refresh.pk, "state": refresh.state, "started": cap is not None}
    rows = slice(page.offset, page.offset + page.limit)
    body = {} if cap is None else cap.as_dict(workers=rows)
    workers = {
        "items": body.pop("workers", []),
        "count": 0 if cap is None else len(cap.workers),
        "limit": page.limit,
        "offset": page.offset,
    }
    return {**head, **body, "workers": workers}


@router.get("/refreshes/{refresh_id}/capacity", response={200: CapacityOut, **COMMON_ERRORS})
def get_refresh_capacity(request: HttpRequest, refresh_id: Id, page: Query[PageParams]):
    """Capacity and goodput of one refresh, from its call journal and gate history: each
    worker's paused intervals (confirmed pause to confirmed resume; never resumed: open), the
    step series of engines running per version, paused and admitted by the gates, and each
    namespace's gated intervals, over the refresh's window. The workers come a page at a time
    (`limit`, `offset`, as every list of the API), the rest whole."""
    require(request, Perm.VIEW)
    # The refresh detail's own lookup: a token limited to some sources sees only theirs.
    refresh = get_object_or_404(limit_to_sources(request, PolicyRefresh.objects), pk=refresh_id)
    return capacity_json(refresh, page)
