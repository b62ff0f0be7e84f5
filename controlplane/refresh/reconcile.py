"""The reconciler (beat): find executing refreshes nobody is running, and resume them.

A refresh is orphaned when its executor's lease expired (the Celery worker died), or when it
was enqueued but never claimed (the broker lost the message). Resuming is just enqueueing the
executor again: it claims the lease with a new fencing token and continues from the journal,
so a duplicate tick or a second beat does no harm.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from controlplane.refresh.models import EXECUTING_STATES, PolicyRefresh


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


def reconcile_policy_refreshes(*, inline: bool = False) -> list[int]:
    """Enqueue (or with `inline`, run here) the executor for every orphaned refresh."""
    from controlplane.refresh.executor import execute_refresh
    from controlplane.refresh.tasks import execute_policy_refresh

    ids = orphaned_refresh_ids()
    for refresh_id in ids:
        if inline:
            execute_refresh(refresh_id)
        else:
            execute_policy_refresh.delay(refresh_id)
    return ids
