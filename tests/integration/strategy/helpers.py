"""Shared helpers for strategy tests: intervals read back from the journal, gate reads."""

from __future__ import annotations

from datetime import datetime

from controlplane.refresh.models import Gate, JournalEntry, PolicyRefresh
from controlplane.simfleet import FleetConfig

FOUR_NAMESPACES = ("rl-a", "rl-b", "rl-c", "rl-d")
#: Two workers of each namespace at a time.
WAVES_OF_TWO = {"kind": "waves", "max_unavailable": 2}


def config(workers: int, namespaces=FOUR_NAMESPACES, seed: int = 5) -> FleetConfig:
    return FleetConfig.generate(
        workers=workers,
        namespaces=namespaces,
        prefix="rl",
        seed=seed,
        listener_env={"DYN_RL_REQUEST_TIMEOUT_SECS": "2"},
    )


def paused_intervals(refresh: PolicyRefresh) -> dict[int, list[tuple[datetime, datetime | None]]]:
    """Per planned worker, each span from a pause call that succeeded to the next successful
    resume (None: never resumed), as the journal recorded them."""
    spans: dict[int, list[tuple[datetime, datetime | None]]] = {}
    rows = (
        JournalEntry.objects.filter(refresh=refresh, ok=True, operation__in=("pause", "resume"))
        .exclude(planned_worker=None)
        .order_by("started_at", "id")
        .values_list("planned_worker_id", "operation", "started_at", "finished_at")
    )
    open_since: dict[int, datetime] = {}
    for worker_id, operation, started, finished in rows:
        if operation == "pause":
            open_since.setdefault(worker_id, started)
        elif worker_id in open_since:
            spans.setdefault(worker_id, []).append((open_since.pop(worker_id), finished))
    for worker_id, since in open_since.items():
        spans.setdefault(worker_id, []).append((since, None))
    return spans


def most_paused_at_once(refresh: PolicyRefresh) -> int:
    """The largest number of workers paused at the same instant, by a sweep over the spans
    (a span ending at the instant another begins does not overlap it)."""
    events: list[tuple[datetime, int]] = []
    for spans in paused_intervals(refresh).values():
        for start, end in spans:
            events.append((start, 1))
            if end is not None:
                events.append((end, -1))
    most = current = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        current += delta
        most = max(most, current)
    return most


def gates_of(source) -> dict[str, Gate]:
    return {g.namespace: g for g in Gate.objects.filter(source=source)}


def keys_in(fleet, namespace: str) -> list[str]:
    return sorted(w["key"] for w in fleet.workers() if w["namespace"] == namespace)
