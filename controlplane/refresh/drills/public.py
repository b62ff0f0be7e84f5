"""A drill as scripts read it: the same keys from `manage.py drill --json` and the JSON API
(`/api/v1/drills/{id}`), so a script can switch between them (README "Rollback drills")."""

from __future__ import annotations

from typing import Any

from controlplane.refresh.models import DrillRun


def drill_json(drill: DrillRun) -> dict[str, Any]:
    """The drill's stable keys; `from_version` is the policy it leaves (and returns to),
    `to_version` the one verified before it."""
    return {
        "id": drill.pk,
        "source": drill.source.name,
        "namespaces": drill.namespaces,
        "instances": drill.instances,
        "from_version": drill.current_version,
        "to_version": drill.previous_version,
        "phase": drill.phase,
        "outcome": drill.outcome,
        "reason": drill.reason,
        "next_step": drill.next_step,
        "forward_refresh_id": drill.forward_refresh_id,
        "back_refresh_id": drill.back_refresh_id,
        "forward_seconds": drill.forward_seconds,
        "back_seconds": drill.back_seconds,
        "started_at": drill.started_at,
        "finished_at": drill.finished_at,
        "requested_by": drill.requested_by_label,
        "scheduled": drill.scheduled,
    }
