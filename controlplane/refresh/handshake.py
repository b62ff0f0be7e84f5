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

Each formation of the group is one handshake **attempt** (`group.attempt`: 1, then one more
each time a retry or a resumed step forms the group again). `refresh.group_ready` carries it
and `broadcast_done` names it: a report for an earlier attempt (a delayed or replayed one,
after a hold and a retry) is refused and audited, so the workers never apply weights that
were broadcast to a group that no longer exists. A report that names no attempt is taken
only on the first attempt, where it cannot mean an earlier one.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict, cast

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
from controlplane.textlimits import LABEL_CHARS

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


class Group(TypedDict, total=False):
    """`PolicyRefresh.group`: the rank map from the plan (`planning.group_plan`), then the
    handshake as it moves. This module owns its keys; empty unless the method is distributed."""

    #: Ranks of the whole group, the trainer's first `trainer_ranks` of them, and each worker
    #: key's `[first rank, how many]`.
    world_size: int
    trainer_ranks: int
    ranks: dict[str, list[int]]
    #: JOINING, READY, BROADCAST_DONE, APPLYING, DESTROYED or TORN_DOWN ("" before the update).
    state: str
    #: The formation this is (1, then one more per retry or resumed step).
    attempt: int
    #: ISO times of each move, None before it (and again once a new attempt begins).
    ready_at: str | None
    broadcast_done_at: str | None
    broadcast_done_by: str | None
    destroyed_at: str | None
    #: Why the group was torn down ("" otherwise).
    reason: str


class GroupPlan(Group, total=False):
    """What `planning.group_plan` returns: the stored rank map, and the mixes it refuses (the
    plan takes `blockers` out before it stores the rest)."""

    blockers: list[str]


#: Event on `refresh.<id>` whenever the handshake moves (payload: the group's public view).
EVENT_GROUP = "group"


def public_view(refresh: PolicyRefresh) -> dict[str, Any]:
    """The group as the trainer and the page see it."""
    group = group_of(refresh)
    return {
        "refresh_id": refresh.pk,
        "refresh_state": refresh.state,
        "state": group.get("state", ""),
        "attempt": group.get("attempt"),
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


def group_of(refresh: PolicyRefresh) -> Group:
    """A copy of the refresh's group, to update and store."""
    return cast(Group, dict(refresh.group or {}))


def move(
    lease,
    refresh_id: int,
    state: str,
    *,
    reason: str | None = None,
    destroyed_at: str | None = None,
) -> PolicyRefresh:
    """The executor moves the handshake (fenced by its lease), saying why it tore the group
    down or when it destroyed it; publishes after commit."""
    with transaction.atomic():
        refresh = _locked(refresh_id)
        group = group_of(refresh)
        group["state"] = state
        if reason is not None:
            group["reason"] = reason
        if destroyed_at is not None:
            group["destroyed_at"] = destroyed_at
        refresh.group = group
        lease.guard(group=refresh.group)
        transaction.on_commit(lambda: _publish(refresh))
    return refresh


def begin_attempt(lease, refresh_id: int) -> PolicyRefresh:
    """A new formation of the group (`joining`): the next handshake attempt, and none of the
    previous attempt's handshake times."""
    with transaction.atomic():
        refresh = _locked(refresh_id)
        group = group_of(refresh)
        attempt: Group = {
            **group,
            "state": JOINING,
            "attempt": int(group.get("attempt") or 0) + 1,
            "reason": "",
            "ready_at": None,
            "broadcast_done_at": None,
            "broadcast_done_by": None,
            "destroyed_at": None,
        }
        refresh.group = attempt
        lease.guard(group=refresh.group)
        transaction.on_commit(lambda: _publish(refresh))
    return refresh


def announce_ready(lease, refresh_id: int, joined: int) -> PolicyRefresh:
    """Every rank joined: record it, audit it, notify the trainer (all in one transaction)."""
    with transaction.atomic():
        refresh = _locked(refresh_id)
        ready: Group = {**group_of(refresh), "state": READY, "ready_at": now_iso()}
        refresh.group = ready
        lease.guard(group=refresh.group)
        record(
            AuditAction.POLICY_REFRESH_GROUP_READY,
            actor=Actor.system("policy-refresh executor"),
            target=refresh,
            details={
                "workers": joined,
                "world_size": refresh.group.get("world_size"),
                "attempt": refresh.group.get("attempt"),
            },
            correlation_id=refresh.correlation_id,
        )
        notify("refresh.group_ready", refresh=refresh, reason=f"{joined} workers joined")
        transaction.on_commit(lambda: _publish(refresh))
    return refresh


class StaleBroadcast(InvalidTransition):
    """A `broadcast_done` for another handshake attempt than the one waiting (409)."""

    code = "broadcast_attempt_mismatch"


def report_broadcast_done(
    refresh: PolicyRefresh, *, actor: Actor, weight_version: Any = None, attempt: Any = None
) -> PolicyRefresh:
    """The trainer broadcast the new weights to the group of handshake `attempt`. Idempotent:
    a repeat answers the refresh as it is. Refused (409) unless the group is ready, for another
    version, and (audited) for another attempt, or without one once the group was re-formed."""
    with transaction.atomic():
        locked = _locked(refresh.pk)
        group = group_of(locked)
        state = group.get("state")
        if weight_version is not None and weight_version != locked.weight_version:
            raise InvalidTransition(
                f"policy refresh #{locked.pk} is to {locked.weight_version!r}, "
                f"not {weight_version!r}"
            )
        stale = _stale_attempt(locked, group, attempt)
        if not stale:
            if state in (BROADCAST_DONE, APPLYING, DESTROYED) and locked.state not in (
                RefreshState.HELD,
            ):
                return locked
            if locked.state != RefreshState.UPDATING or state != READY:
                raise InvalidTransition(
                    f"policy refresh #{locked.pk} is not waiting for a broadcast "
                    f"(state {locked.state}, group {state or 'none'})"
                )
            done: Group = {
                **group,
                "state": BROADCAST_DONE,
                "broadcast_done_at": now_iso(),
                "broadcast_done_by": actor.label[:LABEL_CHARS],
            }
            locked.group = done
            locked.save(update_fields=["group"])
            record(
                AuditAction.POLICY_REFRESH_BROADCAST_DONE,
                actor=actor,
                target=locked,
                details={
                    "refresh_id": locked.pk,
                    "weight_version": locked.weight_version,
                    "attempt": group.get("attempt"),
                },
                correlation_id=locked.correlation_id,
            )
            transaction.on_commit(lambda: _publish(locked))
            return locked
    # Audited outside the refusal's transaction, which raising rolls back.
    record(
        AuditAction.POLICY_REFRESH_BROADCAST_REFUSED,
        actor=actor,
        target=locked,
        details={
            "refresh_id": locked.pk,
            "attempt": attempt,
            "current_attempt": group.get("attempt"),
            "reason": stale,
        },
        correlation_id=locked.correlation_id,
    )
    raise StaleBroadcast(stale)


def _stale_attempt(refresh: PolicyRefresh, group: Group, attempt: Any) -> str:
    """Why a report naming `attempt` is not about the group waiting now (empty: it is)."""
    current = int(group.get("attempt") or 1)  # a group formed before attempts were counted
    if attempt is None:
        if current == 1:
            return ""  # nothing earlier it could be about
        return (
            f"policy refresh #{refresh.pk}'s group was formed again (attempt {current}): "
            f"name the attempt from refresh.group_ready or GET …/group"
        )
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt != current:
        return (
            f"policy refresh #{refresh.pk} waits for the broadcast of attempt {current}, "
            f"not {attempt!r}: that group no longer exists"
        )
    return ""


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
