"""The declared listener scope, enforced: which listed workers a source may act on.

The RL listener decides what it reports from its own environment (contract §1.6). A listener
started with `DYN_NAMESPACE_PREFIX=dynamo` reports every deployment's workers, pause and update
routes included, so what the operator *expects* it to report is declared per source and every
discovery refuses (marks erroring, with the reason) each listed worker outside it. A refused
worker blocks any plan that would include it, so nothing outside the declaration is paused.

Undeclared sources follow the listener, with one exception: a global listener (it reports the
namespace `dynamo` and lists workers of other namespaces) must be declared global first.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.dynamo.scope import GLOBAL_NAMESPACE, Scope


@dataclass(frozen=True, slots=True)
class DeclaredScope:
    """`mode` is `ListenerScope`'s value ("" undeclared, exact, prefix, suffix, global)."""

    mode: str
    namespace: str = ""
    prefix: str = ""
    suffix: str = ""

    @classmethod
    def of(cls, source) -> DeclaredScope:
        return cls(
            source.listener_scope or "",
            source.expected_namespace or "",
            source.expected_prefix or "",
            source.expected_worker_suffix or "",
        )

    def scope(self) -> Scope | None:
        """The scope declared, or None when undeclared. An empty namespace is a namespace
        (the integration reference: an empty `DYN_NAMESPACE` is searched as such)."""
        if self.mode == "exact":
            return Scope("exact", self.namespace)
        if self.mode == "suffix":
            return Scope("exact", f"{self.namespace}-{self.suffix}")
        if self.mode == "prefix":
            return Scope("prefix", self.prefix)
        if self.mode == "global":
            return Scope("global", GLOBAL_NAMESPACE)
        return None

    @property
    def is_global(self) -> bool:
        return self.mode == "global"

    def describe(self) -> str:
        scope = self.scope()
        return scope.explain() if scope is not None else "undeclared (follows the listener)"

    def refusal(self, namespace: str, reported: str) -> str:
        """Why a worker listed in `namespace` is refused ("" when it is in scope).

        `reported` is the listener's own top-level `namespace` for this listing."""
        scope = self.scope()
        if scope is not None:
            if scope.matches(namespace):
                return ""
            return (
                f"outside the declared listener scope: namespace {namespace!r} is not matched "
                f"by {scope.explain()}; refused (the listener reports {reported!r})"
            )
        if reported == GLOBAL_NAMESPACE and namespace != GLOBAL_NAMESPACE:
            return (
                f"the listener runs in global scope (DYN_NAMESPACE_PREFIX={GLOBAL_NAMESPACE}: "
                f"every deployment's workers, here namespace {namespace!r}) but the source does "
                "not declare a global scope; refused"
            )
        return ""

    def own_deployment(self, namespace: str) -> bool:
        """Under a global scope: whether `namespace` is this source's own deployment (its
        declared namespace and that namespace's `-` generations); other namespaces belong to
        other deployments and a plan must name them to pause them."""
        own = self.namespace or GLOBAL_NAMESPACE
        return namespace == own or namespace.startswith(own + "-")


def unconfirmed_other_deployments(
    scope: DeclaredScope, worker_namespaces: list[str], named: list[str] | None
) -> str:
    """Under a global scope, a plan that would pause workers of other deployments goes ahead
    only when it names their namespaces itself: naming them is the confirmation. Returns the
    blocker ("" when there is nothing to confirm). `named` is the plan's own namespace list
    (None or empty: whatever the listener returns, which confirms nothing)."""
    if not scope.is_global:
        return ""
    counts: dict[str, int] = {}
    for namespace in worker_namespaces:
        if not scope.own_deployment(namespace):
            counts[namespace] = counts.get(namespace, 0) + 1
    unconfirmed = sorted(ns for ns in counts if ns not in set(named or ()))
    if not unconfirmed:
        return ""
    listed = ", ".join(f"{ns} ({counts[ns]} workers)" for ns in unconfirmed[:10])
    more = f" and {len(unconfirmed) - 10} more" if len(unconfirmed) > 10 else ""
    return (
        "the global listener scope reaches other deployments: this plan would pause workers "
        f"of {listed}{more}; name these namespaces in the plan to confirm"
    )
