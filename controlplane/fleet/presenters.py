"""What the fleet pages show: per-worker presentation from rows already loaded, and per-source
numbers from aggregate queries (a constant number of queries, whatever the fleet size).

Capability sets come from the family adapters' required routes, so a page never claims a
worker can do something the policy refresh would refuse.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.db.models import Count

from controlplane.dynamo.families import FAMILIES, Operation
from controlplane.dynamo.scope import Scope
from controlplane.fleet.declared_scope import DeclaredScope
from controlplane.fleet.models import Source, Worker, WorkerState
from controlplane.fleet.validation import expected_scope

#: The capability sets shown next to a worker's routes, in display order.
CAPABILITY_SETS: tuple[tuple[str, tuple[Operation, ...]], ...] = (
    (
        "disk update",
        (
            Operation.PAUSE,
            Operation.UPDATE_FROM_DISK,
            Operation.GET_WEIGHT_VERSION,
            Operation.RESUME,
        ),
    ),
    (
        "distributed update",
        (
            Operation.INIT_WEIGHTS_GROUP,
            Operation.PAUSE,
            Operation.UPDATE_FROM_DISTRIBUTED,
            Operation.GET_WEIGHT_VERSION,
            Operation.RESUME,
        ),
    ),
    ("cache flush", (Operation.FLUSH_CACHE,)),
    ("version readback", (Operation.GET_WEIGHT_VERSION,)),
)


@dataclass(frozen=True, slots=True)
class Capability:
    name: str
    enabled: bool

    @property
    def label(self) -> str:
        return f"{self.name} {'✔' if self.enabled else '✘'}"


@lru_cache(maxsize=1024)
def capabilities(family_name: str, routes: tuple[str, ...]) -> tuple[Capability, ...]:
    """Which capability sets `routes` enable for the family. Cached: fleets repeat route sets."""
    family = FAMILIES.get(family_name)
    names = frozenset(routes)
    return tuple(
        Capability(name, family is not None and all(family.supports(op, names) for op in ops))
        for name, ops in CAPABILITY_SETS
    )


@lru_cache(maxsize=1024)
def route_groups(routes: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Routes grouped by their dialect prefix (`control/`, `update/`, bare names)."""
    groups: dict[str, list[str]] = {}
    for route in routes:
        prefix, _, _ = route.rpartition("/")
        groups.setdefault(prefix or "engine", []).append(route)
    return tuple((g, tuple(sorted(r))) for g, r in sorted(groups.items()))


def version_label(version: Any, declared: bool = True) -> str:
    if version is None or version == "":
        return "undeclared"
    return version if isinstance(version, str) else json.dumps(version)


@dataclass(frozen=True, slots=True)
class VersionShare:
    label: str
    count: int
    minority: bool


def version_distribution(pairs) -> list[VersionShare]:
    """`(version, count)` pairs of present workers → shares, most common first; every share
    but the top one is skew."""
    counts: Counter[str] = Counter()
    for version, count in pairs:
        counts[version_label(version)] += count
    ordered = counts.most_common()
    skewed = len(ordered) > 1
    return [VersionShare(label, n, skewed and i > 0) for i, (label, n) in enumerate(ordered)]


@dataclass(frozen=True, slots=True)
class SourceSummary:
    """The numbers shown for one source on the overview and at the top of its page."""

    source: Source
    counts: dict[str, int]
    versions: list[VersionShare]
    scope: Scope
    scope_ok: bool | None

    @property
    def scope_declared(self) -> str:
        """The declared mode ("" undeclared)."""
        return self.source.listener_scope

    @property
    def scope_global(self) -> bool:
        return self.scope.is_global

    @property
    def scope_notes(self) -> list[str]:
        """The listener's rules people trip over (integration reference, contract §1.6)."""
        return scope_notes(self.source)

    @property
    def present(self) -> int:
        return self.counts.get(WorkerState.LIVE, 0) + self.counts.get(WorkerState.ERRORING, 0)

    @property
    def skewed(self) -> bool:
        return len(self.versions) > 1


def summarise(source: Source) -> SourceSummary:
    """Two aggregate queries, whatever the fleet size."""
    return summarise_all([source])[0]


def summarise_all(sources: Iterable[Source]) -> list[SourceSummary]:
    """One summary per source, in the order given, from the same two aggregate queries
    however many sources there are (the overview lists every source)."""
    sources = list(sources)
    if not sources:
        return []
    workers = Worker.objects.filter(source__in=sources).order_by()
    counts: dict[int, dict[str, int]] = {
        s.pk: dict.fromkeys(WorkerState.values, 0) for s in sources
    }
    for source_id, state, n in workers.values_list("source_id", "state").annotate(n=Count("id")):
        counts[source_id][state] = n
    pairs: dict[int, list[tuple[Any, int]]] = defaultdict(list)
    for source_id, version, n in (
        workers.exclude(state=WorkerState.GONE)
        .values_list("source_id", "weight_version")
        .annotate(n=Count("id"))
    ):
        pairs[source_id].append((version, n))
    return [
        SourceSummary(
            source,
            counts[source.pk],
            version_distribution(pairs[source.pk]),
            source_scope(source),
            scope_matches_report(source),
        )
        for source in sources
    ]


@dataclass(frozen=True, slots=True)
class FilterOptions:
    """The choices of the worker table's filters, with how many workers each one shows."""

    namespaces: list[tuple[str, int]]
    versions: list[tuple[str, int]]
    routes: list[str]


def filter_options(source: Source) -> FilterOptions:
    """Three aggregate queries: workers per namespace, per version, and the distinct route sets
    (fleets repeat a handful of route sets, so that is a few rows, not one per worker)."""
    workers = Worker.objects.filter(source=source).order_by()
    namespaces = list(
        workers.values_list("namespace").annotate(n=Count("id")).order_by("namespace")
    )
    versions: Counter[str] = Counter()
    for version, n in workers.values_list("weight_version").annotate(n=Count("id")):
        versions[version_label(version)] += n
    route_sets = workers.values_list("routes", flat=True).distinct()
    routes = sorted({r for rs in route_sets for r in (rs or ())})
    return FilterOptions(namespaces, sorted(versions.items()), routes)


def source_scope(source: Source) -> Scope:
    """The declared scope; for an undeclared source, what its expected fields resolve to as the
    listener would resolve the same environment."""
    declared = DeclaredScope.of(source).scope()
    if declared is not None:
        return declared
    return expected_scope(
        {
            "expected_namespace": source.expected_namespace,
            "expected_prefix": source.expected_prefix,
            "expected_worker_suffix": source.expected_worker_suffix,
        }
    )


SCOPE_NOTES = {
    "global": "Global scope: every deployment's pause, resume and update routes are reachable "
    "through this listener; a plan that would pause another deployment's workers must name "
    "those namespaces to go ahead.",
    "exact": "An empty DYN_NAMESPACE is a namespace of its own (the integration reference); "
    "Dynamo 1.6.1 was observed to read it as `dynamo` (contract §1.6).",
    "suffix": "The listener always appends `-suffix`; a native sidecar skips it when its "
    "namespace already ends with it, so `prod-a` + `a` registers `prod-a` while the listener "
    "looks for `prod-a-a`.",
    "prefix": "During an operator's rolling update the prefix matches both generations "
    "(`ns-<old>` and `ns-<new>`) at once; both are listed and planned.",
    "": "Undeclared: workers are taken as the listener reports them, except a global listener, "
    "whose workers are refused until the scope is declared global.",
}


def scope_notes(source: Source) -> list[str]:
    mode = source.listener_scope or ""
    notes = [SCOPE_NOTES[mode]] if mode in SCOPE_NOTES else []
    if mode in ("global", "prefix"):
        notes.append(SCOPE_NOTES["prefix"] if mode == "global" else "")
    return [n for n in notes if n]


def scope_matches_report(source: Source) -> bool | None:
    """Whether the listener reports the namespace the operator expected (None: not yet known)."""
    if not source.reported_namespace:
        return None
    return source_scope(source).namespace == source.reported_namespace
