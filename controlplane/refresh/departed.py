"""Planned workers a refresh no longer calls: departed (left the fleet) or left out (by the
failure budget), as worker step results.

Below the executor: `namespaces`, the waves and the steps ask these questions, and none of them
needs the rest of the executor package to do so (`executor/departures.py` records departures).
"""

from __future__ import annotations

from controlplane.refresh.models import WorkerStepResult

__all__ = ["DEPARTED", "LEFT_OUT", "departed_ids", "departed_keys", "left_out_ids"]

DEPARTED = "departed"
#: A worker result status: the refresh's failure budget left this worker out (quarantined,
#: out of the verified set; `executor/budget.py`). Like a departure, no later step calls it.
LEFT_OUT = "left_out"


def departed_ids(refresh_id: int) -> set[int]:
    """Planned workers recorded as having left the fleet (at any step)."""
    return set(
        WorkerStepResult.objects.filter(refresh_id=refresh_id, status=DEPARTED).values_list(
            "planned_worker_id", flat=True
        )
    )


def left_out_ids(refresh_id: int) -> set[int]:
    """Planned workers the failure budget left out (at any step)."""
    return set(
        WorkerStepResult.objects.filter(refresh_id=refresh_id, status=LEFT_OUT).values_list(
            "planned_worker_id", flat=True
        )
    )


def departed_keys(refresh_id: int) -> set[str]:
    return set(
        WorkerStepResult.objects.filter(refresh_id=refresh_id, status=DEPARTED).values_list(
            "planned_worker__key", flat=True
        )
    )
