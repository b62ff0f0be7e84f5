"""One refresh, several namespaces: which are still in play and which passed verify.

A held refresh of several namespaces can be resolved namespace by namespace: a person
force-reopens one (its engines are resumed, its gate opens `open_forced`) or reopens every
namespace whose workers all passed verify (`open`, with the verified set), and the refresh goes
on — held, retried or aborted — for the namespaces left. A resolved namespace is recorded in
`PolicyRefresh.resolved_namespaces`; from then on no step calls its workers, the agreement check
and the reopen leave them out, and its scope lock is gone, so a new refresh may take it.
"""

from __future__ import annotations

from django.db.models import Q

from controlplane import lockorder
from controlplane.refresh.departed import departed_ids, left_out_ids
from controlplane.refresh.models import PolicyRefresh, ScopeLock, WorkerStepResult
from controlplane.refresh.step_order import StepName

FORCE_REOPENED = "force_reopened"
REOPENED = "reopened"


def open_namespaces(refresh: PolicyRefresh) -> list[str]:
    """The refresh's namespaces not yet resolved on their own, in order."""
    resolved = refresh.resolved_namespaces or {}
    return [ns for ns in refresh.namespaces if ns not in resolved]


def resolved_worker_ids(refresh: PolicyRefresh) -> set[int]:
    """Planned workers of the namespaces resolved on their own."""
    resolved = list((refresh.resolved_namespaces or {}).keys())
    if not resolved:
        return set()
    return set(refresh.workers.filter(namespace__in=resolved).values_list("pk", flat=True))


def out_of_play_ids(refresh: PolicyRefresh) -> set[int]:
    """Planned workers no step touches any more: departed, left out by the failure budget, or
    in a resolved namespace."""
    return departed_ids(refresh.pk) | left_out_ids(refresh.pk) | resolved_worker_ids(refresh)


def verified_namespaces(refresh: PolicyRefresh) -> list[str]:
    """Open namespaces whose every remaining planned worker's latest verify result passed.

    A namespace with no remaining worker (all departed) is not counted: nothing in it was
    verified, so there is nothing to open it for.
    """
    latest: dict[int, str] = dict(
        WorkerStepResult.objects.filter(refresh=refresh, step=StepName.VERIFY)
        .order_by("id")
        .values_list("planned_worker_id", "status")
    )
    gone = departed_ids(refresh.pk) | left_out_ids(refresh.pk)
    by_namespace: dict[str, list[int]] = {}
    for pk, namespace in refresh.workers.values_list("pk", "namespace"):
        if pk not in gone:
            by_namespace.setdefault(namespace, []).append(pk)
    return [
        ns
        for ns in open_namespaces(refresh)
        if by_namespace.get(ns)
        and all(latest.get(pk) in ("ok", "skipped") for pk in by_namespace[ns])
    ]


def release_namespace_locks(refresh: PolicyRefresh, namespaces: list[str]) -> None:
    """Drop the refresh's scope locks on `namespaces` only (the rest stay held)."""
    if not namespaces:
        return
    lockorder.domain_lock("scope locks")
    ScopeLock.objects.filter(Q(refresh=refresh) & Q(namespace__in=namespaces)).delete()
