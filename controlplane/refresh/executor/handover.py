"""A refresh takes over the quarantines of the workers it planned.

A drifted worker's quarantine catches it up to its gate's verified policy. Once a policy
refresh owns the scope, that catch-up would fight it: both would pause, update and resume the
same worker, one to the old policy and one to the new, and whichever came last would decide
what the worker serves behind the other's back (the ledger would then file samples under the
wrong version). So there is one owner at a time:

- a refresh does not start while a catch-up runs in its scope (`intents/lifecycle.py` refuses
  with a conflict that names the quarantine; a trainer's webhook retries it);
- a catch-up does not begin while a refresh holds the scope (`quarantine.claim`);
- when the refresh's executor begins, it ends the open quarantines of every worker it planned
  as `superseded`, in the same transaction as its first gate move: from then on the refresh
  pauses, updates, verifies and resumes those workers like the rest, and a queued catch-up
  that arrives later finds nothing to do. A worker the refresh did not plan keeps its
  quarantine; its catch-up waits until the scope is free and then aims at the gate's policy
  of that moment.
"""

from __future__ import annotations

from django.utils import timezone

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.refresh import gates
from controlplane.refresh.models import (
    OPEN_QUARANTINE_STATES,
    PlannedWorker,
    PolicyRefresh,
    Quarantine,
    QuarantineState,
)
from controlplane.textlimits import STATE_REASON_CHARS


def take_over_quarantines(refresh: PolicyRefresh) -> list[Quarantine]:
    """End the open quarantines of the refresh's planned workers as `superseded`.

    Call inside the transaction of the refresh's first step, after the lease guard and before
    its gate move; `audit_taken_over` after that move (lock order: gates, then quarantine rows,
    the audit chain head last)."""
    # Only quarantines older than the refresh: those its own failure budget opens later own
    # their workers on purpose (`budget.open_quarantines`), also across a retry of this step.
    open_ones = list(
        Quarantine.objects.filter(
            source_id=refresh.source_id,
            namespace__in=refresh.namespaces,
            state__in=OPEN_QUARANTINE_STATES,
            created_at__lt=refresh.started_at or timezone.now(),
        ).exclude(state=QuarantineState.CATCHING_UP)
    )
    if not open_ones:
        return []
    planned = set(
        PlannedWorker.objects.filter(refresh=refresh).values_list("namespace", "instance_id")
    )
    candidates = [q for q in open_ones if (q.namespace, q.instance_id) in planned]
    if not candidates:
        return []
    by_namespace: dict[str, set[str]] = {}
    for q in candidates:
        by_namespace.setdefault(q.namespace, set()).add(q.instance_id)
    gates.drop_drift_entries(refresh.source, by_namespace)
    lockorder.domain_lock("quarantines")
    reason = (
        f"superseded by policy refresh #{refresh.pk}, which brings it to {refresh.weight_version!r}"
    )[:STATE_REASON_CHARS]
    now = timezone.now()
    taken = list(
        Quarantine.objects.select_for_update(no_key=True, of=("self",))
        .filter(pk__in=[q.pk for q in candidates], state__in=OPEN_QUARANTINE_STATES)
        .exclude(state=QuarantineState.CATCHING_UP)
        .order_by("pk")
    )
    Quarantine.objects.filter(pk__in=[q.pk for q in taken]).update(
        state=QuarantineState.SUPERSEDED, reason=reason, updated_at=now, finished_at=now
    )
    return taken


def audit_taken_over(refresh: PolicyRefresh, taken: list[Quarantine], *, actor: Actor) -> None:
    for q in taken:
        record(
            AuditAction.QUARANTINE_SUPERSEDED,
            actor=actor,
            target=q,
            details={"key": q.key, "previous_state": q.state, "refresh_id": refresh.pk},
            correlation_id=q.correlation_id,
        )
