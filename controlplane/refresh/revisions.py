"""A source's revision history: the versions a refresh verified there, newest first.

Read from the serving ledger (`ServingInterval` rows a refresh verified), never kept as a copy:
a version is a revision of the source once some refresh read it back and verified it on an
instance, and its policy (method, model path, ...) is that refresh's target. A rollback (the
plan page's, `intents.recovery.plan_rollback`) may target any revision; the gates say where each one
stands now.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Max

from controlplane.refresh.models import Evidence, Gate, PolicyRefresh, ServingInterval

__all__ = ["Revision", "revision_history", "version_key"]


def version_key(version: Any) -> str:
    """One text per weight version (a version is JSON: a string, a number, an object)."""
    return json.dumps(version, sort_keys=True)


@dataclass(frozen=True)
class Revision:
    """One verified version of a source: what a rollback to it would install, and where."""

    version: Any
    #: The target of the newest refresh that verified it: what a rollback plans.
    policy: dict[str, Any]
    #: The newest refresh that verified it.
    refresh_id: int
    #: When that refresh last verified it on an instance.
    verified_at: datetime
    #: The namespaces it was ever verified in; the instances its newest refresh verified.
    namespaces: tuple[str, ...]
    instances: int
    #: The namespaces whose gate stands for this version now.
    current_in: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return version_key(self.version)

    @property
    def label(self) -> str:
        return self.version if isinstance(self.version, str) else json.dumps(self.version)


def revision_history(source, *, limit: int = 50) -> list[Revision]:
    """The source's verified versions, newest verification first (at most `limit`).

    Two queries on the ledger and one on the refreshes named there, whatever the fleet size.
    """
    rows = (
        ServingInterval.objects.filter(
            source=source, evidence=Evidence.VERIFIED_REFRESH, refresh__isnull=False
        )
        .values("refresh_id", "namespace")
        .annotate(last=Max("valid_from"), n=Count("instance_id", distinct=True))
    )
    per_refresh: dict[int, dict[str, Any]] = {}
    for row in rows:
        seen = per_refresh.setdefault(row["refresh_id"], {"last": row["last"], "ns": {}})
        seen["last"] = max(seen["last"], row["last"])
        seen["ns"][row["namespace"]] = row["n"]
    targets = dict(PolicyRefresh.objects.filter(pk__in=per_refresh).values_list("pk", "target"))
    current: dict[str, list[str]] = {}
    for namespace, version in Gate.objects.filter(
        source=source, verified_version__isnull=False
    ).values_list("namespace", "verified_version"):
        current.setdefault(version_key(version), []).append(namespace)
    by_version: dict[str, Revision] = {}
    for refresh_id, seen in sorted(per_refresh.items(), key=lambda kv: kv[1]["last"]):
        target = targets.get(refresh_id) or {}
        if "weight_version" not in target:
            continue
        key = version_key(target["weight_version"])
        earlier = by_version.get(key)
        namespaces = dict(seen["ns"])
        if earlier is not None:  # verified again later: one revision, the newest policy
            for ns in earlier.namespaces:
                namespaces.setdefault(ns, 0)
        by_version[key] = Revision(
            version=target["weight_version"],
            policy=dict(target),
            refresh_id=refresh_id,
            verified_at=seen["last"],
            namespaces=tuple(sorted(namespaces)),
            instances=sum(seen["ns"].values()),
            current_in=tuple(sorted(current.get(key, []))),
        )
    return sorted(by_version.values(), key=lambda r: r.verified_at, reverse=True)[:limit]
