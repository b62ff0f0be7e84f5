"""Workers that left the fleet mid-refresh: found by a fresh discovery, recorded, then skipped.

A worker that crashed or was removed is absent from its source's listing. There is nothing to
resume, retry or verify on it, and trying again only fails again — which used to keep the refresh
held at `release` for ever with its scope locked. So whenever a person asks the executor to go
on after a hold (retry, abort with resume, force-reopen), a worker step first reads the listener
once and records every pending planned worker that is no longer listed as `departed` ("left the
fleet"). Departed workers count as done for every later step, and `reopen` does not count them
as a membership change. The listing is journaled like the membership checks, each departure is a
worker step result (a grid cell on the refresh page) and one audit event names them all.

A first attempt never does this: a worker that vanishes during an unattended run holds the
refresh, so a person sees it before the scope goes on without it. If the listener cannot be read
nobody is declared gone: the workers are called as usual and their failures speak for them.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.dynamo.discovery import DiscoveredWorker, fetch_discovery
from controlplane.dynamo.errors import DiscoveryError
from controlplane.dynamo.http import make_client
from controlplane.fleet.discovery.deadlines import listener_read_timeout
from controlplane.fleet.discovery.rejections import blocker_text, blocking
from controlplane.refresh.departed import (
    DEPARTED,
)
from controlplane.refresh.models import JournalEntry, PlannedWorker, WorkerStepResult
from controlplane.textlimits import REASON_CHARS, URL_CHARS

LEFT_THE_FLEET = "left the fleet: absent from a fresh discovery of {source}"
EXECUTOR = Actor.system("policy-refresh executor")


def read_listing(ctx, step: str) -> tuple[dict[str, DiscoveredWorker], str]:
    """Read the listener now: (the scope's listed workers by key, error). Journaled.

    The scope is the refresh's namespaces; the journal row keeps the keys and, for workers
    listed with a probe error, that error.
    """
    refresh = ctx.refresh
    started = datetime.now(UTC)
    t0 = time.perf_counter()

    # Past the listener's per-worker deadline: one hung worker is then named in the listing
    # (its `error`) instead of failing the read (contract §1.4).
    timeout = listener_read_timeout(ctx.cfg.timeout)

    async def fetch():
        async with make_client(timeout=timeout) as client:
            return await fetch_discovery(
                client, ctx.cfg.policy, refresh.source.listener_url, timeout=timeout
            )

    error = ""
    listed: dict[str, DiscoveredWorker] = {}
    try:
        result = asyncio.run(fetch())
        listed = {
            w.identity.key: w for w in result.workers if w.identity.namespace in refresh.namespaces
        }
        # An entry we could not read may be a serving worker of the scope: fail closed.
        error = blocker_text(blocking(result.rejected, refresh.namespaces))
    except DiscoveryError as exc:
        error = exc.reason
    body: dict[str, Any] | None = None
    if not error:
        errors = {key: w.error for key, w in sorted(listed.items()) if w.error is not None}
        body = {"in_scope": sorted(listed), **({"errors": errors} if errors else {})}
    with transaction.atomic():
        ctx.lease.guard()
        JournalEntry.objects.create(
            refresh=refresh,
            step=step,
            operation="discovery",
            method="GET",
            url=refresh.source.listener_url[:URL_CHARS],
            ok=not error,
            error=error,
            response_body=body,
            duration_ms=(time.perf_counter() - t0) * 1000.0,
            attempt=ctx.attempt,
            started_at=started,
            finished_at=datetime.now(UTC),
            lease_token=ctx.lease.token,
        )
    return listed, error


def read_membership(ctx, step: str) -> tuple[set[str], str]:
    """Read the listener now: (keys of the scope's listed workers, error). Journaled."""
    listed, error = read_listing(ctx, step)
    return set(listed), error


def rechecks_membership(ctx) -> bool:
    """A person asked to go on after a hold: a retry (not a takeover after an executor crash)."""
    return ctx.attempt > 1 and not ctx.takeover


def record_departures(
    ctx, step: str, candidates: list[PlannedWorker], current: set[str] | None = None
) -> set[int]:
    """Record every candidate absent from a fresh listing as departed; return their ids.

    `current` is a listing the caller already read; otherwise the listener is read here.
    """
    if not candidates:
        return set()
    if current is None:
        current, error = read_membership(ctx, step)
        if error:
            return set()
    gone = [w for w in candidates if w.key not in current]
    if not gone:
        return set()
    refresh = ctx.refresh
    with transaction.atomic():
        ctx.lease.guard()
        write_departures(
            refresh,
            gone,
            step=step,
            attempt=ctx.attempt,
            reason=LEFT_THE_FLEET.format(source=refresh.source.name),
            actor=EXECUTOR,
            outcome="left the fleet; not called again by this refresh",
        )
    return {w.pk for w in gone}


def write_departures(
    refresh, workers: list[PlannedWorker], *, step: str, attempt: int, reason: str, actor, outcome
) -> None:
    """Record `workers` as departed at `step` (a result each) and audit them in one event.

    The caller holds the transaction (and the executor's lease or the refresh row): the audit
    chain head is taken last.
    """
    now = timezone.now()
    WorkerStepResult.objects.bulk_create(
        WorkerStepResult(
            refresh=refresh,
            planned_worker=w,
            step=step,
            attempt=attempt,
            status=DEPARTED,
            error=reason[:REASON_CHARS],
            finished_at=now,
        )
        for w in workers
    )
    record(
        AuditAction.POLICY_REFRESH_WORKERS_DEPARTED,
        actor=actor,
        target=refresh,
        details={
            "refresh_id": refresh.pk,
            "step": step,
            "workers": [w.key for w in workers],
            "outcome": outcome,
        },
        correlation_id=refresh.correlation_id,
    )
