"""Shared helpers for drill tests: a source verified at v1 then v2, so v1 is what a drill
rolls back to."""

from __future__ import annotations

from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import DrillRun, Gate, JournalEntry, RefreshState
from tests.integration.refresh.helpers import actor_for, make_source, run_inline


def verified_twice(fleet, user, **fields):
    source = make_source(fleet, **fields)
    for version in ("v1", "v2"):
        refresh = run_inline(source, user, version)
        assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    return source


def run_drill_inline(drill: DrillRun) -> DrillRun:
    from controlplane.refresh.drills.runner import advance

    assert advance(drill.pk, execute=execute_refresh)
    drill.refresh_from_db()
    return drill


def called_instances(refresh) -> set[str]:
    return set(
        JournalEntry.objects.filter(refresh=refresh)
        .exclude(planned_worker=None)
        .values_list("planned_worker__instance_id", flat=True)
    )


def verified_sets(source) -> dict[str, set[str]]:
    return {g.namespace: set(g.verified_instances) for g in Gate.objects.filter(source=source)}


__all__ = ["actor_for", "called_instances", "run_drill_inline", "verified_sets", "verified_twice"]
