"""Which workers a plan covers, by ordered passes that each return their blockers.

The passes judge the live workers a fresh discovery left in the chosen namespaces against what
the operator asked: the membership seen before the discovery, a subset of workers, named
instances, and a staged strategy (waves, a canary). Each narrows the scope or sets its waves,
and returns its blockers, which the plan keeps in `SCOPE_PASSES` order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controlplane.dynamo.families import UpdateMethod
from controlplane.fleet.declared_scope import DeclaredScope, unconfirmed_other_deployments
from controlplane.fleet.discovery.rejections import blocker_text, blocking
from controlplane.fleet.models import Worker
from controlplane.refresh.strategy import Placed, Strategy, assign_waves


def membership_of(workers: Iterable[Worker]) -> list[str]:
    """The discovered workers' keys (statically configured workers do not come and go)."""
    return sorted(w.key for w in workers if w.static_worker_id is None)


@dataclass(frozen=True)
class ScopeRequest:
    """What the operator asked for, and the live workers it is judged against."""

    #: The live workers of the chosen namespaces, as the fresh discovery left them.
    workers: list[Worker]
    #: The membership seen before the fresh discovery (empty: nothing seen yet).
    last_view: frozenset[str]
    strategy: Strategy
    method: str
    worker_ids: list[int] | None = None
    instance_ids: list[str] | None = None
    #: Listener entries the fresh discovery could not read (`DiscoveryRun.rejected_entries`).
    rejected: tuple[dict, ...] = ()
    #: The source's declared listener scope (None: not judged).
    declared: DeclaredScope | None = None
    #: The namespaces the plan names itself (None: whatever the listener returns).
    named: list[str] | None = None


@dataclass
class Scope:
    """The workers a plan covers, their waves, and the blockers of the scope passes."""

    selected: list[Worker]
    #: The chosen workers' keys when the operator chose a subset (None: every live worker).
    subset_keys: list[str] | None = None
    wave_of: dict[str, int] = field(default_factory=dict)
    wave_count: int = 0
    blockers: list[str] = field(default_factory=list)


def membership_pass(request: ScopeRequest, scope: Scope) -> list[str]:
    """Workers that joined or left during the fresh discovery: the operator looked at another
    fleet than the one that would be refreshed."""
    membership = set(membership_of(request.workers))
    if not request.last_view or membership == request.last_view:
        return []
    joined, left = membership - request.last_view, request.last_view - membership
    return [
        f"membership differs from the last view ({len(joined)} joined, {len(left)} left); "
        "review the fleet and plan again"
    ]


def readable_pass(request: ScopeRequest, scope: Scope) -> list[str]:
    """Fail closed on listener entries we could not read (`fleet.discovery.rejections`): one
    naming a namespace of the plan is an unavailable worker there, one whose namespace is
    unreadable makes the whole listing partial. The reason of each is shown."""
    text = blocker_text(blocking(request.rejected, request.named))
    return [text] if text else []


def deployments_pass(request: ScopeRequest, scope: Scope) -> list[str]:
    """Under a declared global scope, pausing another deployment's workers takes a plan that
    names their namespaces (`fleet.declared_scope.unconfirmed_other_deployments`)."""
    if request.declared is None:
        return []
    namespaces = [w.namespace for w in scope.selected]
    text = unconfirmed_other_deployments(request.declared, namespaces, request.named)
    return [text] if text else []


def subset_pass(request: ScopeRequest, scope: Scope) -> list[str]:
    """The workers the operator chose, each still live in the chosen namespaces."""
    if not request.worker_ids:
        return []
    chosen = set(request.worker_ids)
    scope.selected = [w for w in scope.selected if w.pk in chosen]
    scope.subset_keys = sorted(w.key for w in scope.selected)
    if len(scope.selected) != len(chosen):
        return ["some selected workers are gone or outside the chosen namespaces"]
    return []


def instances_pass(request: ScopeRequest, scope: Scope) -> list[str]:
    """The instances the operator named, in the order named, each a live worker of the scope."""
    if request.instance_ids is None:
        return []
    by_instance = {w.instance_id: w for w in scope.selected}
    missing = [i for i in request.instance_ids if i not in by_instance]
    scope.selected = [by_instance[i] for i in request.instance_ids if i in by_instance]
    if missing:
        return [f"instance(s) {', '.join(missing)} are not live workers of the chosen scope"]
    return []


def nonempty_pass(request: ScopeRequest, scope: Scope) -> list[str]:
    return [] if scope.selected else ["no live workers in the chosen scope"]


def waves_pass(request: ScopeRequest, scope: Scope) -> list[str]:
    """The strategy's waves; a distributed update's one collective group cannot be staged."""
    blockers = []
    staged = request.strategy.staged or request.instance_ids is not None
    if staged and request.method == UpdateMethod.DISTRIBUTED:
        blockers.append(
            "a distributed update forms one collective group of every worker: it cannot run "
            "in waves, as a canary or on named instances; plan it all at once"
        )
    scope.wave_of, scope.wave_count, wave_blockers = assign_waves(
        request.strategy, [Placed(w.key, w.namespace, w.instance_id) for w in scope.selected]
    )
    return blockers + wave_blockers


#: The scope passes in order; a pass sees the scope the passes before it narrowed.
SCOPE_PASSES: tuple[tuple[str, Callable[[ScopeRequest, Scope], list[str]]], ...] = (
    ("membership", membership_pass),
    ("readable", readable_pass),
    ("subset", subset_pass),
    ("instances", instances_pass),
    ("nonempty", nonempty_pass),
    ("deployments", deployments_pass),
    ("waves", waves_pass),
)


def select_scope(request: ScopeRequest) -> Scope:
    scope = Scope(selected=list(request.workers))
    for _name, scope_pass in SCOPE_PASSES:
        scope.blockers += scope_pass(request, scope)
    return scope
