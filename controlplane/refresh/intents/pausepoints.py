"""Pause points: a staged refresh waits between waves until a person continues it.

A pause point is either planned (`Strategy.pause_after`: the waves after which to wait) or asked
for while the refresh runs (`request_pause`: it waits after the wave in progress). Waiting
(`waiting`) nothing is paused by the refresh — the verified waves serve the new version, the
rest the old, and the gate lists both sets — and no executor runs. Its exits:

- `continue_refresh`: the next wave starts;
- `abort_policy_refresh` (with or without resuming engines) and `end_policy_refresh`: the
  refresh ends; the gate keeps the old set and drift reconciliation takes the new one over;
- `rollback_policy_refresh`: a new refresh of the scope back to the policy the gate stood for
  before this one.
"""

from __future__ import annotations

from django.db import transaction

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor
from controlplane.refresh.errors import InvalidTransition, wrong_state
from controlplane.refresh.executor.waves import is_staged
from controlplane.refresh.intents import base
from controlplane.refresh.intents.base import audit_refresh, locked_refresh
from controlplane.refresh.live import publish_state_on_commit
from controlplane.refresh.models import EXECUTING_STATES, PolicyRefresh, RefreshState
from controlplane.refresh.progress import (
    leaving_pause_point,
    pause_is_requested,
    progress_of,
    with_pause_requested,
)


def request_pause(refresh: PolicyRefresh, *, actor: Actor) -> PolicyRefresh:
    """Wait after the wave in progress (the running wave finishes: pausing mid-wave would
    leave workers paused for as long as the person takes)."""
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        if not is_staged(refresh) or refresh.waves < 2:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} has one wave: there is no point between waves "
                "to wait at"
            )
        if refresh.state not in EXECUTING_STATES or refresh.state in (
            RefreshState.RELEASING,
            RefreshState.REOPENING,
            RefreshState.CANARY_ROLLBACK,
            RefreshState.ABORTING,
        ):
            raise wrong_state(
                refresh,
                why="a pause is asked for while its waves run",
            )
        if refresh.wave >= refresh.waves:
            raise InvalidTransition(
                f"policy refresh #{refresh.pk} is in its last wave: nothing is left to wait for"
            )
        if pause_is_requested(progress_of(refresh)):
            return refresh
        progress = with_pause_requested(refresh)
        # Only this column: the executor owns the rest of the row while it runs.
        PolicyRefresh.objects.filter(pk=refresh.pk).update(progress=progress)
        refresh.progress = progress
        audit_refresh(AuditAction.POLICY_REFRESH_PAUSE_REQUESTED, refresh, actor, wave=refresh.wave)
    publish_state_on_commit(refresh)
    return refresh


def continue_refresh(
    refresh: PolicyRefresh, *, actor: Actor, enqueue: bool = True
) -> PolicyRefresh:
    """Leave a pause point: the next wave is paused, updated and verified."""
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        if refresh.state != RefreshState.WAITING:
            raise wrong_state(refresh, wanted="waiting at a pause point")
        progress, after = leaving_pause_point(refresh)
        refresh.transition(RefreshState.PAUSING, wave=after + 1, progress=progress)
        audit_refresh(
            AuditAction.POLICY_REFRESH_CONTINUED,
            refresh,
            actor,
            after_wave=after,
            wave=after + 1,
            waves=refresh.waves,
        )
        if enqueue:
            base.enqueue_execution(refresh.pk)
    publish_state_on_commit(refresh)
    return refresh
