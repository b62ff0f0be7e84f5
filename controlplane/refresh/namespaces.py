"""One refresh, several namespaces: which are still in play and which passed verify.

A held refresh of several namespaces can be resolved namespace by namespace: a person
force-reopens one (its engines are resumed, its gate opens `open_forced`) or reopens every
namespace whose workers all passed verify (`open`, with the verified set), and the refresh goes
on — held, retried or aborted — for the namespaces left. A resolved namespace is recorded in
`PolicyRefresh.resolved_namespaces`; from then on no step calls its workers, the agreement check
and the reopen leave them out, and its scope lock is gone, so a new refresh may take it.

This module owns that column's keys: its shape is `ResolvedNamespaces` (namespace →
`Resolution`), and every read or update goes through a helper here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict, cast

from django.db.models import Q
from django.utils import timezone

from controlplane import lockorder
from controlplane.refresh.departed import departed_ids, left_out_ids
from controlplane.refresh.models import PolicyRefresh, ScopeLock, WorkerStepResult
from controlplane.refresh.step_order import StepName

#: How a namespace was resolved on its own (`Resolution.outcome`).
FORCE_REOPENED = "force_reopened"
REOPENED = "reopened"


class Resolution(TypedDict, total=False):
    """One namespace resolved on its own: how, by whom, when (ISO) and why."""

    #: FORCE_REOPENED or REOPENED.
    outcome: str
    by: str
    at: str
    reason: str


#: `PolicyRefresh.resolved_namespaces`: namespace → its `Resolution`.
ResolvedNamespaces = dict[str, Resolution]


def resolved_of(refresh: PolicyRefresh) -> ResolvedNamespaces:
    """A copy of the refresh's resolved namespaces, to update and store."""
    return cast(ResolvedNamespaces, dict(refresh.resolved_namespaces or {}))


def outcome_in(resolved: Mapping[str, Any] | None, namespace: str) -> str:
    """How `namespace` was resolved in a stored `resolved_namespaces` ("" when it was not)."""
    return ((resolved or {}).get(namespace) or {}).get("outcome", "")


def with_resolved(
    refresh: PolicyRefresh, namespaces: Iterable[str], outcome: str, *, by: str, reason: str = ""
) -> ResolvedNamespaces:
    """The refresh's resolved namespaces with `namespaces` resolved now as `outcome`."""
    resolved = resolved_of(refresh)
    at = timezone.now().isoformat()
    for namespace in namespaces:
        resolved[namespace] = Resolution(outcome=outcome, by=by, at=at, reason=reason)
    return resolved


def reopened_namespaces(refresh: PolicyRefresh) -> set[str]:
    """Namespaces reopened verified on their own (their engines were resumed and verified)."""
    return {ns for ns, how in resolved_of(refresh).items() if how.get("outcome") == REOPENED}


def resolved_summary(refresh: PolicyRefresh) -> str:
    """The namespaces resolved on their own, in words (for an end reason); "" when none."""
    parts = []
    for namespace, how in sorted(resolved_of(refresh).items()):
        text = f"{namespace} {how.get('outcome', '').replace('_', '-')} by {how.get('by', '?')}"
        if how.get("reason"):
            text += f": {how['reason']}"
        parts.append(text)
    return "; ".join(parts)


def open_namespaces(refresh: PolicyRefresh) -> list[str]:
    """The refresh's namespaces not yet resolved on their own, in order."""
    resolved = resolved_of(refresh)
    return [ns for ns in refresh.namespaces if ns not in resolved]


def resolved_worker_ids(refresh: PolicyRefresh) -> set[int]:
    """Planned workers of the namespaces resolved on their own."""
    resolved = list(resolved_of(refresh))
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
