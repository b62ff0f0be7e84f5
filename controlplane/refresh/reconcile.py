"""The reconciler (beat): find executing refreshes nobody is running, and resume them.

A refresh is orphaned when its executor's lease expired (the Celery worker died), or when it
was enqueued but never claimed (the broker lost the message). Resuming is just enqueueing the
executor again: it claims the lease with a new fencing token and continues from the journal,
so a duplicate tick or a second beat does no harm.

It also frees orphaned scope locks: rows whose refresh is no longer active (ended by a path that
crashed between its writes, or by an older version). A lock nobody can act on would make every
later refresh of that namespace answer `refresh_conflict` for ever. An active refresh's lock is
never touched here: a held refresh is always ended by a person (retry, rollback, force-reopen,
abort with resume, or end), and an executing one is resumed or, once its executor is dead,
ended by an approver.

And it picks up quarantines nobody is running (`requeue_stalled_quarantines`): a catch-up whose
heartbeat went silent (its Celery worker died) or a queued one whose task was lost is queued
again, so no drifted worker is left paused — or unpaused and unverified — until a person looks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.refresh import quarantine
from controlplane.refresh.gates import release_scope
from controlplane.refresh.models import (
    ACTIVE_STATES,
    EXECUTING_STATES,
    PolicyRefresh,
    Quarantine,
    ScopeLock,
)

RECONCILER = Actor.system("policy-refresh reconciler")


def resend_within_seconds() -> float:
    """At most how long after the broker is back a started refresh whose executor task was
    lost is enqueued again: the unclaimed period plus one reconciler tick."""
    return settings.REFRESH_LEASE_SECONDS + settings.RECONCILE_TICK_SECONDS


def orphaned_refresh_ids() -> list[int]:
    now = timezone.now()
    # Give a freshly enqueued refresh one lease period to be picked up before resending it.
    unclaimed_since = now - timedelta(seconds=settings.REFRESH_LEASE_SECONDS)
    return list(
        PolicyRefresh.objects.filter(state__in=EXECUTING_STATES)
        .filter(
            Q(lease_expires_at__lt=now)
            | Q(lease_expires_at__isnull=True, state_changed_at__lt=unclaimed_since)
        )
        .values_list("pk", flat=True)
    )


def release_orphaned_locks() -> list[int]:
    """Drop the scope locks of refreshes that are no longer active; returns their ids."""
    ids = list(
        ScopeLock.objects.exclude(refresh__state__in=ACTIVE_STATES)
        .values_list("refresh_id", flat=True)
        .distinct()
    )
    for refresh_id in ids:
        with transaction.atomic():
            refresh = PolicyRefresh.objects.select_for_update().get(pk=refresh_id)
            if refresh.state in ACTIVE_STATES:
                continue  # became active again between the query and the lock
            locks = list(
                ScopeLock.objects.filter(refresh=refresh).values_list("namespace", flat=True)
            )
            release_scope(refresh, "")
            record(
                AuditAction.POLICY_REFRESH_RECOVERED,
                actor=RECONCILER,
                target=refresh,
                details={
                    "refresh_id": refresh.pk,
                    "state": refresh.state,
                    "released_orphaned_locks": sorted(locks),
                },
                correlation_id=refresh.correlation_id,
            )
    return ids


def reconcile_policy_refreshes(*, resume: Callable[[int], object]) -> list[int]:
    """Free orphaned scope locks, then `resume` every orphaned refresh: the beat task passes a
    send of the executor task (`jobs.send`, which never raises), tests and tools
    `execute_refresh` to run it here. (Taking it as an argument keeps this module free of the
    Celery tasks that call it.) A refresh started while the broker was down is found here: it
    is executing with no lease once `REFRESH_LEASE_SECONDS` have passed."""
    release_orphaned_locks()
    ids = orphaned_refresh_ids()
    for refresh_id in ids:
        resume(refresh_id)
    return ids


def requeue_stalled_quarantines(*, resume: Callable[[int], object]) -> list[int]:
    """Hand every silent quarantine back to the catch-up queue (audited) and `resume` it after
    commit: the beat passes a send of the catch-up task. Returns the ids queued again."""
    requeued = []
    for q in Quarantine.objects.filter(quarantine.stalled()).order_by("pk"):
        if quarantine.requeue_stalled(q):
            requeued.append(q.pk)
            transaction.on_commit(functools.partial(resume, q.pk))
    return requeued
