"""Live refresh and gate streams: the group names, and every event the refresh app publishes.

Groups: `refresh.<id>` (one refresh's page: state, steps and per-call progress), `refreshes`
(lists and banners follow every refresh's state) and `gates` (every gate change, for the gate
page, the banners and the gate API stream `ws/gates/`). The fleet pages show gate badges, so a
gate or refresh change also announces their summaries (`controlplane.fleet.live.publish_summary`:
the source id only; the fleet streams render the summary where they receive it).

Consumers, actions and the executor import group names and publishers from here only. Publishing
is best effort (`controlplane.realtime`): every consumer resyncs from the database on connect.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import transaction

from controlplane.fleet import live as fleet_live
from controlplane.realtime import publish

if TYPE_CHECKING:
    from controlplane.refresh.models import PolicyRefresh

REFRESHES_GROUP = "refreshes"
GATES_GROUP = "gates"

#: Events on `refresh.<id>`. State and step changes make the page rebuild from the journal;
#: progress only patches the cells and timelines it names.
EVENT_STATE = "state"
EVENT_STEP = "step"
EVENT_STEP_RUNNING = "step.running"
EVENT_PROGRESS = "progress"
#: On `refreshes`, with the refresh's source id so a banner can ignore other sources.
EVENT_REFRESH_STATE = "refresh.state"
#: On `gates`: one serialised gate (`refresh.gates.serialize_gate`).
EVENT_GATE_CHANGED = "gate.changed"


def refresh_group(refresh_id: int) -> str:
    return f"refresh.{refresh_id}"


def publish_state(refresh: PolicyRefresh) -> None:
    """A refresh changed state (or was asked to abort): its page, lists, banners, fleet pages."""
    payload = {
        "id": refresh.pk,
        "state": refresh.state,
        "failed_step": refresh.failed_step,
        "held_reason": refresh.held_reason,
    }
    publish(refresh_group(refresh.pk), EVENT_STATE, payload)
    # Lists and banners follow every refresh through one group.
    publish(REFRESHES_GROUP, EVENT_REFRESH_STATE, {**payload, "source_id": refresh.source_id})
    announce_to_fleet_pages({refresh.source_id})


def publish_state_on_commit(refresh: PolicyRefresh) -> None:
    """Publish the refresh's state once the current transaction commits (at once outside one):
    nobody sees a state the database may still roll back."""
    transaction.on_commit(lambda: publish_state(refresh))


def publish_step(refresh_id: int, step: str, status: str, detail: str | None = None) -> None:
    payload = {"step": step, "status": status}
    if detail is not None:
        payload["detail"] = detail[:500]
    publish(refresh_group(refresh_id), EVENT_STEP, payload)


def publish_step_running(refresh_id: int, step: str, worker_ids: list[int]) -> None:
    publish(refresh_group(refresh_id), EVENT_STEP_RUNNING, {"step": step, "workers": worker_ids})


def publish_progress(
    refresh_id: int, step: str, done: int, total: int, cells: list[dict[str, Any]]
) -> None:
    """One journal flush: how far the step is, and the cells of the workers that finished."""
    publish(
        refresh_group(refresh_id),
        EVENT_PROGRESS,
        {"step": step, "done": done, "total": total, "cells": cells},
    )


def publish_gate_changes(gates: list[dict[str, Any]]) -> None:
    """Serialised gates, after the transaction that changed them commits."""
    # One group for every gate change: the gate page, banners and the gate API stream.
    for gate in gates:
        publish(GATES_GROUP, EVENT_GATE_CHANGED, gate)
    announce_to_fleet_pages({gate["source_id"] for gate in gates})


def announce_to_fleet_pages(source_ids: Iterable[int]) -> None:
    """Fleet pages show our gate and refresh badges in the source summary and overview card:
    announce that they changed; each receiving process renders them once for its subscribers
    (the executor announces ten state changes a run and must not pay a render for each).
    Never the worker table (no row shows a gate), which at 2,000 workers was most of every
    refresh state change's cost."""
    fleet_live.publish_summary(sorted(set(source_ids)))
