"""The collective weight-update group of a distributed refresh, and the trainer handshake.

A collective group forms only when every rank joins at once, so the executor has every worker
join concurrently (`executor/distributed.py`); the trainer holds ranks 0..trainer_ranks-1.
Once all have joined, the refresh says so three ways — `refresh.group_ready` notifications
(signed webhooks), the `group.ready` event on `ws/refreshes/<id>/`, and the long-poll API
`GET /api/v1/refreshes/<id>/group` — and waits for the trainer to broadcast and report
`broadcast_done` (API or signed webhook). Then the workers apply, read the version back and
the group is destroyed. Any timeout tears the group down and holds the refresh.

`PolicyRefresh.group` holds the rank map (from the plan) and the handshake's state:
`joining → ready → broadcast_done → applying → destroyed`, or `torn_down` with a reason.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane import lockorder
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.notify.emit import notify
from controlplane.realtime import publish
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.live import refresh_group
from controlplane.refresh.models import PolicyRefresh, RefreshState

JOINING = "joining"
READY = "ready"
BROADCAST_DONE = "broadcast_done"
APPLYING = "applying"
DESTROYED = "destroyed"
TORN_DOWN = "torn_down"
#: Refresh states in which the group will not move again (a long poll answers at once).
ENDED = frozenset(
    {
        RefreshState.HELD,
        RefreshState.SUCCEEDED,
        RefreshState.ABORTED,
        RefreshState.FAILED,
        RefreshState.REJECTED,
        RefreshState.ROLLED_BACK,
    }
)
#: Event on `refresh.<id>` whenever the handshake moves (payload: the group's public view).
EVENT_GROUP = "group"


def public_view(refresh: PolicyRefresh) -> dict[str, Any]:
    """The group as the trainer and the page see it."""
    group = dict(refresh.group or {})
    return {
        "refresh_id": refresh.pk,
        "refresh_state": refresh.state,
        "state": group.get("state", ""),
        "world_size": group.get("world_size"),
        "trainer_ranks": group.get("trainer_ranks"),
        "ranks": group.get("ranks", {}),
        "weight_version": refresh.weight_version,
        "ready_at": group.get("ready_at"),
        "broadcast_done_at": group.get("broadcast_done_at"),
        "broadcast_done_by": group.get("broadcast_done_by"),
        "destroyed_at": group.get("destroyed_at"),
        "reason": group.get("reason", ""),
    }


def now_iso() -> str:
    return timezone.now().isoformat()


def _locked(refresh_id: int) -> PolicyRefresh:
    lockorder.domain_lock("a policy refresh row")
    return (
        PolicyRefresh.objects.select_for_update(no_key=True, of=("self",))
        .select_related("source")
        .get(pk=refresh_id)
    )


def move(lease, refresh_id: int, state: str, **fields: Any) -> PolicyRefresh:
    """The executor moves the handshake (fenced by its lease); publishes after commit."""
    with transaction.atomic():
        refresh = _locked(refresh_id)
        refresh.group = {**(refresh.group or {}), "state": state, **fields}
        lease.guard(group=refresh.group)
        transaction.on_commit(lambda: _publish(refresh))
    return refresh


def announce_ready(lease, refresh_id: int, joined: int) -> PolicyRefresh:
    """Every rank joined: record it, audit it, notify the trainer (all in one transaction)."""
    with transaction.atomic():
        refresh = _locked(refresh_id)
        refresh.group = {**(refresh.group or {}), "state": READY, "ready_at": now_iso()}
        lease.guard(group=refresh.group)
        record(
            AuditAction.POLICY_REFRESH_GROUP_READY,
            actor=Actor.system("policy-refresh executor"),
            target=refresh,
            details={"workers": joined, "world_size": refresh.group.get("world_size")},
            correlation_id=refresh.correlation_id,
        )
        notify("refresh.group_ready", refresh=refresh, reason=f"{joined} workers joined")
        transaction.on_commit(lambda: _publish(refresh))
    return refresh


def report_broadcast_done(
    refresh: PolicyRefresh, *, actor: Actor, weight_version: Any = None
) -> PolicyRefresh:
    """The trainer broadcast the new weights to the group. Idempotent: a repeat answers the
    refresh as it is. Refused (409) unless the group is ready, and for another version."""
    with transaction.atomic():
        locked = _locked(refresh.pk)
        group = dict(locked.group or {})
        state = group.get("state")
        if weight_version is not None and weight_version != locked.weight_version:
            raise InvalidTransition(
                f"policy refresh #{locked.pk} is to {locked.weight_version!r}, "
                f"not {weight_version!r}"
            )
        if state in (BROADCAST_DONE, APPLYING, DESTROYED) and locked.state not in (
            RefreshState.HELD,
        ):
            return locked
        if locked.state != RefreshState.UPDATING or state != READY:
            raise InvalidTransition(
                f"policy refresh #{locked.pk} is not waiting for a broadcast "
                f"(state {locked.state}, group {state or 'none'})"
            )
        locked.group = {
            **group,
            "state": BROADCAST_DONE,
            "broadcast_done_at": now_iso(),
            "broadcast_done_by": actor.label[:200],
        }
        locked.save(update_fields=["group"])
        record(
            AuditAction.POLICY_REFRESH_BROADCAST_DONE,
            actor=actor,
            target=locked,
            details={"refresh_id": locked.pk, "weight_version": locked.weight_version},
            correlation_id=locked.correlation_id,
        )
        transaction.on_commit(lambda: _publish(locked))
    return locked


def wait_for_broadcast(lease, refresh_id: int, timeout: float, poll: float = 0.1) -> str:
    """Block until the trainer reports (`done`), an abort is asked (`aborted`) or `timeout`
    passes (`timeout`), renewing the lease meanwhile so no reconciler takes the refresh over."""
    deadline = time.monotonic() + timeout
    renew_every = max(lease.seconds / 3.0, poll)
    renewed = time.monotonic()
    while True:
        found = (
            PolicyRefresh.objects.filter(pk=refresh_id)
            .values_list("group", "abort_requested")
            .first()
        )
        group, abort_requested = found if found is not None else ({}, True)
        if (group or {}).get("state") == BROADCAST_DONE:
            return "done"
        if abort_requested:
            return "aborted"
        if time.monotonic() >= deadline:
            return "timeout"
        if time.monotonic() - renewed >= renew_every:
            with transaction.atomic():
                lease.guard()
            renewed = time.monotonic()
        time.sleep(poll)


def wait_for_change(refresh_id: int, after: str | None, timeout: float, poll: float = 0.2):
    """Long poll: the refresh once its group state differs from `after` (or it stopped
    executing), or as it is when `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        refresh = PolicyRefresh.objects.select_related("source").get(pk=refresh_id)
        state = (refresh.group or {}).get("state", "")
        finished = refresh.state in ENDED
        if state != (after or "") or finished or time.monotonic() >= deadline:
            return refresh
        time.sleep(poll)


def _publish(refresh: PolicyRefresh) -> None:
    publish(refresh_group(refresh.pk), EVENT_GROUP, public_view(refresh))
