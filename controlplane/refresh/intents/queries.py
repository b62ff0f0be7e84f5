"""What the pages and the other intents ask about a refresh without changing it: whether it can
be ended, which workers it left paused, the last verified policy, whether a hold is about
membership, and the summary of what was resolved.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from controlplane.fleet.models import Source
from controlplane.refresh.executor.abort import left_paused, left_paused_keys
from controlplane.refresh.membership import change_of, has_change
from controlplane.refresh.models import (
    EXECUTING_STATES,
    WAITING_STATES,
    Gate,
    PolicyRefresh,
    RefreshState,
)
from controlplane.refresh.namespaces import resolved_summary
from controlplane.refresh.step_order import StepName

__all__ = [
    "ENDABLE_STATES",
    "MEMBERSHIP_STEPS",
    "can_end",
    "executor_alive",
    "is_membership_hold",
    "last_verified_policy",
    "left_paused",
    "left_paused_keys",
    "resolved_summary",
]


#: States an approver may end a refresh from (executing ones only once no executor is alive).
ENDABLE_STATES = (
    EXECUTING_STATES | WAITING_STATES | {RefreshState.AWAITING_APPROVAL, RefreshState.HELD}
)


def executor_alive(refresh: PolicyRefresh) -> bool:
    # A claimed lease that has not expired: an executor is calling workers right now.
    return refresh.lease_expires_at is not None and refresh.lease_expires_at > timezone.now()


def can_end(refresh: PolicyRefresh) -> bool:
    """Whether `end_policy_refresh` would accept this refresh now (for the page's button)."""
    if refresh.state not in ENDABLE_STATES:
        return False
    return refresh.state not in EXECUTING_STATES or not executor_alive(refresh)


def last_verified_policy(source: Source, namespaces: list[str]) -> dict[str, Any] | None:
    gate = (
        Gate.objects.filter(source=source, namespace__in=namespaces, verified_policy__isnull=False)
        .order_by("-updated_at")
        .first()
    )
    return gate.verified_policy if gate else None


MEMBERSHIP_STEPS = (StepName.RESOLVE, StepName.REOPEN)


def is_membership_hold(refresh: PolicyRefresh) -> bool:
    """Held by a membership check that named who left, joined or changed."""
    return (
        refresh.state == RefreshState.HELD
        and refresh.failed_step in MEMBERSHIP_STEPS
        and has_change(change_of(refresh))
    )
