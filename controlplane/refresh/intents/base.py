"""The kit every refresh intent is written with: the refresh row locked, its audit row, the
scope conflict, and the executor enqueued.

Every intent module of this package (and `canary`, `pausepoints`, `expiry`) takes these from here
instead of from one another, so none of them imports a sibling's private helpers.
"""

from __future__ import annotations

from typing import Any

from controlplane import jobs, lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.fleet.models import Source
from controlplane.refresh.errors import (
    RefreshConflict,
)
from controlplane.refresh.models import (
    PolicyRefresh,
    ScopeLock,
)

__all__ = [
    "EXECUTE_TASK",
    "audit_refresh",
    "enqueue_execution",
    "locked_refresh",
    "scope_conflict",
]


#: By name (controlplane/jobs.py): this module stays free of the tasks module.
EXECUTE_TASK = "refresh.execute_policy_refresh"


def enqueue_execution(refresh_id: int) -> None:
    # Robust: the change is committed; a send the broker refuses is logged, and the reconciler
    # resends a started refresh nobody claimed (refresh/reconcile.py `orphaned_refresh_ids`).
    jobs.enqueue(EXECUTE_TASK, refresh_id)


def audit_refresh(
    action: AuditAction, refresh: PolicyRefresh, actor: Actor, **details: Any
) -> None:
    record(
        action,
        actor=actor,
        target=refresh,
        details={"refresh_id": refresh.pk, **details},
        correlation_id=refresh.correlation_id,
    )


def scope_conflict(source: Source, namespaces: list[str]) -> RefreshConflict:
    lock = (
        ScopeLock.objects.filter(source=source, namespace__in=namespaces)
        .select_related("refresh")
        .first()
    )
    if lock is None:
        return RefreshConflict("another policy refresh is starting on this scope")
    other = lock.refresh
    return RefreshConflict(
        f"policy refresh #{other.pk} ({other.state}) is active on "
        f"{source.name}/{lock.namespace}; wait for it or resolve it first",
        active_refresh_id=other.pk,
    )


def locked_refresh(refresh: PolicyRefresh) -> PolicyRefresh:
    lockorder.domain_lock("a policy refresh row")
    return (
        PolicyRefresh.objects.select_for_update(no_key=True, of=("self",))
        .select_related("source")
        .get(pk=refresh.pk)
    )
