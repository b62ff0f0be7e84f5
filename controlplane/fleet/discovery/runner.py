"""`run_discovery`: one discovery refresh of one source, end to end.

Claim the source (a conditional UPDATE, so a duplicate tick or a second beat does nothing),
observe the fleet over the network, then store, diff, audit and publish in one transaction.
Listener problems never raise: the run is recorded with its error and the source goes stale,
keeping its last known workers visible.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DataError, transaction
from django.db.models import Q
from django.utils import timezone

from controlplane import lockorder, telemetry
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.dynamo.errors import DiscoveryError, one_line
from controlplane.dynamo.limits import storable_text
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet import live
from controlplane.fleet.declared_scope import DeclaredScope
from controlplane.fleet.discovery.observe import ObservedFleet, StaticSpec, observe
from controlplane.fleet.discovery.rejections import stored_rejections
from controlplane.fleet.discovery.store import StoredRefresh, store_observation
from controlplane.fleet.models import DiscoveryRun, DiscoveryTrigger, Source
from controlplane.fleet.signals import discovery_finished
from controlplane.notify.emit import notify

logger = logging.getLogger(__name__)
SYSTEM = Actor.system("discovery")
#: How many rejected listener entries a run keeps for display.
REJECTED_KEEP = 50


def _lease_seconds() -> float:
    # Long enough for the slowest legal refresh; a crashed worker's claim expires after it.
    return (
        settings.DISCOVERY_LISTENER_TIMEOUT_SECONDS
        + 4 * settings.DISCOVERY_PROBE_TIMEOUT_SECONDS
        + 60
    )


def _claim(source: Source, trigger: str) -> datetime | None:
    """Take the source for one refresh; returns the lease (the fencing value) or None."""
    now = timezone.now()
    lease = now + timedelta(seconds=_lease_seconds())
    rows = Source.objects.filter(
        Q(discovery_claimed_until__isnull=True) | Q(discovery_claimed_until__lt=now), pk=source.pk
    )
    if trigger == DiscoveryTrigger.SCHEDULE:
        if not source.is_due(now):
            return None
        # Compare-and-swap on the last start: a second tick that read the same due source finds
        # it already restarted and claims nothing, even after the first run has finished.
        rows = rows.filter(enabled=True, last_discovery_started_at=source.last_discovery_started_at)
    claimed = rows.update(discovery_claimed_until=lease, last_discovery_started_at=now)
    return lease if claimed else None


def _release(source_id: int, lease) -> None:
    Source.objects.filter(pk=source_id, discovery_claimed_until=lease).update(
        discovery_claimed_until=None
    )


def _run_coroutine(coro):
    """asyncio.run, also from a thread that already runs a loop (an async caller's thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # In this thread's context: the trace span and the correlation id go along.
        return pool.submit(contextvars.copy_context().run, asyncio.run, coro).result()


def _notify_stale(source: Source, reason: str) -> None:
    notify("source.stale", source=source, reason=reason)


def run_discovery(
    source_id: int,
    *,
    trigger: DiscoveryTrigger | str,
    wait: float = 0.0,
) -> DiscoveryRun | None:
    """Run one refresh. Returns its DiscoveryRun, or None when the source is gone, disabled
    for scheduling, not yet due, or claimed by another refresh for longer than `wait` seconds."""
    trigger = DiscoveryTrigger(trigger)
    deadline = time.monotonic() + wait
    while True:
        source = Source.objects.filter(pk=source_id).first()
        if source is None:
            return None
        lease = _claim(source, trigger)
        if lease is not None:
            break
        if trigger == DiscoveryTrigger.SCHEDULE or time.monotonic() >= deadline:
            return None
        time.sleep(0.1)  # waiting for another refresh's claim (plans need a fresh view)
    try:
        # One trace per discovery refresh when tracing is on: its probes send `traceparent`.
        with telemetry.run_span(
            "discovery refresh",
            attributes={"controlplane.source": source.name, "controlplane.trigger": trigger},
        ):
            return _refresh_claimed(source, trigger)
    finally:
        _release(source.pk, lease)


def _store(
    source: Source, observed: ObservedFleet, run: DiscoveryRun, now
) -> tuple[StoredRefresh | None, str]:
    """Store the observation in a savepoint. The client boundary already refuses what the
    database cannot hold; should a value still slip through, the run is recorded as failed
    with the database's reason instead of the whole refresh vanishing with an exception."""
    try:
        with transaction.atomic():
            return store_observation(source, observed.workers, run, now), ""
    except (DataError, UnicodeError) as exc:
        logger.exception("discovery of %s could not be stored", source.name)
        return None, storable_text(f"could not store the observation: {one_line(exc, 300)}")


def _refresh_claimed(source: Source, trigger: str) -> DiscoveryRun:
    started_at = timezone.now()
    t0 = time.perf_counter()
    statics = [
        StaticSpec(
            s.pk,
            s.name,
            s.namespace,
            s.component,
            s.system_url,
            s.family,
            tuple(s.allowed_routes),
            s.model,
            s.endpoint,
            s.declared_instance_id,
        )
        for s in source.static_workers.all()
    ]
    observed: ObservedFleet | None = None
    error = ""
    try:
        policy = OutboundPolicy.from_cidrs(source.allowed_networks)
        observed = _run_coroutine(
            observe(
                source_id=source.pk,
                listener_url=source.listener_url,
                policy=policy,
                statics=statics,
                listener_timeout=settings.DISCOVERY_LISTENER_TIMEOUT_SECONDS,
                probe_timeout=settings.DISCOVERY_PROBE_TIMEOUT_SECONDS,
                concurrency=settings.DISCOVERY_PROBE_CONCURRENCY,
                frontend_url=source.frontend_url,
                scope=DeclaredScope.of(source),
                release=source.dynamo_release or "",
            )
        )
    except DiscoveryError as exc:
        error = exc.reason if getattr(exc, "reason", None) else str(exc)
    except ValueError as exc:  # a stored CIDR list that no longer parses
        error = f"allowed networks: {exc}"
    # Reasons quote what the listener said; the run, the source and the audit row store them.
    error = storable_text(error)

    with transaction.atomic():
        now = timezone.now()
        run = DiscoveryRun.objects.create(
            source=source,
            trigger=trigger,
            started_at=started_at,
            ok=observed is not None,
            error=error,
        )
        was_stale = source.stale
        stored = None
        audits: list[tuple[AuditAction, dict]] = []
        if observed is not None:
            stored, error = _store(source, observed, run, now)
            run.ok, run.error = stored is not None, error
        if observed is not None and stored is not None:  # stored only exists when observed
            diff = stored.diff
            run.reported_namespace = observed.result.namespace
            run.workers_total, run.workers_live = stored.total, stored.live
            run.workers_erroring = stored.erroring
            run.joined, run.left, run.changed = len(diff.joined), len(diff.left), len(diff.changed)
            run.rejected_entries = stored_rejections(observed.result.rejected[:REJECTED_KEEP])
            source.reported_namespace = observed.result.namespace
            source.stale, source.stale_reason = False, ""
            source.last_success_at = now
            if diff.membership_changed:
                audits.append(
                    (
                        AuditAction.DISCOVERY_MEMBERSHIP_CHANGED,
                        {"run_id": run.pk, "trigger": trigger, **diff.audit_details()},
                    )
                )
            if was_stale:
                audits.append((AuditAction.SOURCE_RECOVERED, {"run_id": run.pk}))
            touched = [stored.pks[k] for k in diff.touched]
        else:
            source.stale, source.stale_reason = True, error
            if not was_stale:
                audits.append((AuditAction.SOURCE_WENT_STALE, {"run_id": run.pk, "reason": error}))
                _notify_stale(source, error)
            touched = []
        run.finished_at = timezone.now()
        run.duration_ms = (time.perf_counter() - t0) * 1000.0
        run.save()
        source.last_discovery_finished_at = run.finished_at
        lockorder.domain_lock("the source row")
        Source.objects.filter(pk=source.pk).update(
            reported_namespace=source.reported_namespace,
            stale=source.stale,
            stale_reason=source.stale_reason,
            last_success_at=source.last_success_at,
            last_discovery_finished_at=source.last_discovery_finished_at,
        )
        # Lock order: the source row above, the audit chain head last (controlplane/lockorder.py).
        for action, details in audits:
            record(action, actor=SYSTEM, target=source, details=details)
        source_id = source.pk
        transaction.on_commit(lambda: live.publish_refresh(source_id, touched))
        finished = {
            "source_id": source_id,
            "run_id": run.pk,
            "ok": run.ok,
            "went_stale": source.stale and not was_stale,
            "recovered": was_stale and not source.stale,
        }
        transaction.on_commit(
            lambda: discovery_finished.send_robust(sender=Source, **finished), robust=True
        )
    if error:
        logger.warning("discovery of %s failed: %s", source.name, error)
    return run
