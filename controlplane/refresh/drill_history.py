"""What a drill goes back to, and which workers it takes.

The gate keeps only the policy it verified last (`Gate.verified_policy`: where a drill
returns). The policy verified before it is derived from refresh history: the target of the
newest refresh of the namespace that succeeded over the whole namespace (no `instances`
restriction, so drills' own refreshes never count, and not force-reopened there) at a
weight version other than the gate's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import OuterRef, Q, Subquery

from controlplane.fleet.models import Source
from controlplane.refresh.models import DrillOutcome, DrillRun, Gate, PolicyRefresh, RefreshState
from controlplane.refresh.namespaces import FORCE_REOPENED, outcome_in

#: How far back in a source's succeeded refreshes to look for the previous policy.
HISTORY_LIMIT = 500


def previous_policy(gate: Gate) -> dict[str, Any] | None:
    """The policy this namespace was verified at before its current one, or None."""
    current = (gate.verified_policy or {}).get("weight_version")
    succeeded = (
        PolicyRefresh.objects.filter(
            source_id=gate.source_id, state=RefreshState.SUCCEEDED, instances__isnull=True
        )
        .order_by("-finished_at", "-id")
        .values_list("namespaces", "target", "resolved_namespaces")[:HISTORY_LIMIT]
    )
    # Filtered here rather than with a JSON `contains` lookup, which SQLite (embedded) lacks.
    for namespaces, target, resolved in succeeded:
        if gate.namespace not in (namespaces or []):
            continue
        if outcome_in(resolved, gate.namespace) == FORCE_REOPENED:
            continue
        if (target or {}).get("weight_version") != current:
            return target
    return None


def pick_subset(gate: Gate, count: int) -> list[str]:
    """The `count` verified instances of the gate with the lowest ids (deterministic, so a
    person can tell from the gate which workers a drill will take)."""
    return sorted(gate.verified_instances, key=int)[:count]


def drilled_instances(source, namespace: str) -> set[str]:
    """Instances a running drill of the source owns in `namespace` (drift leaves them be)."""
    return {
        instance_id
        for namespaces, instances in DrillRun.objects.filter(
            source=source, outcome=DrillOutcome.RUNNING
        ).values_list("namespaces", "instances")
        if namespace in (namespaces or [])
        for instance_id in instances or []
    }


#: What the fleet overview says about each source's drills: the newest drill that proved the
#: rollback, the newest that ended (to say a failure), and the one running.
STATUS_KINDS = {
    "proven": Q(outcome=DrillOutcome.SUCCEEDED),
    "latest": ~Q(outcome=DrillOutcome.RUNNING),
    "running": Q(outcome=DrillOutcome.RUNNING),
}


def drill_statuses(source_ids: Iterable[int]) -> dict[int, dict[str, DrillRun | None]]:
    """Per source id, `{"proven", "latest", "running"}` drills (or None), in two queries
    however many sources are asked for: the ids by correlated subqueries, then the rows."""
    ids = sorted(set(source_ids))
    newest = DrillRun.objects.filter(source=OuterRef("pk")).order_by("-started_at", "-id")
    picks = list(
        Source.objects.filter(pk__in=ids)
        .annotate(
            **{
                kind: Subquery(newest.filter(condition).values("pk")[:1])
                for kind, condition in STATUS_KINDS.items()
            }
        )
        .values_list("pk", *STATUS_KINDS)
    )
    wanted = {pk for _, *drills in picks for pk in drills if pk is not None}
    rows = DrillRun.objects.in_bulk(wanted) if wanted else {}
    statuses: dict[int, dict[str, DrillRun | None]] = {
        pk: dict.fromkeys(STATUS_KINDS) for pk in ids
    }
    for source_id, *drills in picks:
        for kind, pk in zip(STATUS_KINDS, drills, strict=True):
            statuses[source_id][kind] = rows.get(pk) if pk is not None else None
    return statuses
