"""Global search: one text box finds workers, instance ids, policy refreshes and weight versions.

What a query means is decided from its shape, so each kind runs at most one query and every
query is a bounded, indexed look-up (the page costs the same few queries however big the
fleet is):

- a worker key, whole or a prefix (`namespace/component/endpoint/instance_id`, split on "/"):
  leading parts match exactly, the last one as a prefix (index `worker_key_prefix_idx`);
  text without a "/" matches namespaces by prefix through the same index;
- digits: an instance id prefix (index `worker_instance_prefix_idx`) and, when short enough,
  a policy refresh id; `#12` and `policy-refresh-12` (its correlation id) are refresh ids;
- anything: a weight version prefix among the versions refreshes targeted and workers report.
  Versions are JSON (a trainer sends text or a number), so this one reads the version text of
  refresh targets and workers with a LIMIT rather than an index; both tables are bounded by
  retention (refreshes) and the fleet (workers).

Each group is capped at `LIMIT` hits; `more` says when a group had more than it shows.
`source_ids` limits every group to those sources (a scoped token); None means every source.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Func, Q, QuerySet, TextField
from django.db.models.fields.json import KT

from controlplane.dynamo import limits
from controlplane.fleet.models import Worker
from controlplane.intake.provenance.trail import version_key
from controlplane.refresh.models import PolicyRefresh

__all__ = [
    "LIMIT",
    "MAX_QUERY",
    "Group",
    "JsonText",
    "Results",
    "VersionHit",
    "normalize",
    "search",
]

#: Hits shown per group.
LIMIT = 20
#: Longer queries are cut here: no worker key, id or version we store is longer.
MAX_QUERY = 4 * limits.NAME_MAX + limits.INSTANCE_ID_MAX
_KEY_FIELDS = ("namespace", "component", "endpoint", "instance_id")
_DIGITS = re.compile(r"[0-9]{1,20}")
_REFRESH_ID = re.compile(r"(?:#|policy-refresh-)?([1-9][0-9]{0,17})")


@dataclass
class Group[T]:
    hits: list[T] = field(default_factory=list)
    more: bool = False

    def __bool__(self) -> bool:
        return bool(self.hits)


@dataclass
class VersionHit:
    version: str
    #: A policy refresh targeted it.
    targeted: bool = False
    #: A worker reports it now (or last reported it, if gone).
    reported: bool = False


@dataclass
class Results:
    query: str
    workers: Group[Worker] = field(default_factory=Group)
    instances: Group[Worker] = field(default_factory=Group)
    refreshes: Group[PolicyRefresh] = field(default_factory=Group)
    versions: Group[VersionHit] = field(default_factory=Group)

    @property
    def empty(self) -> bool:
        return not (self.workers or self.instances or self.refreshes or self.versions)

    @property
    def total(self) -> int:
        groups = (self.workers, self.instances, self.refreshes, self.versions)
        return sum(len(g.hits) for g in groups)


def normalize(query: str) -> str:
    return query.strip()[:MAX_QUERY]


def search(query: str, *, source_ids: Iterable[int] | None = None) -> Results:
    q = normalize(query)
    results = Results(query=q)
    if not q:
        return results
    limit = None if source_ids is None else set(source_ids)
    workers = Worker.objects.select_related("source")
    refreshes = PolicyRefresh.objects.select_related("source")
    if limit is not None:
        workers = workers.filter(source_id__in=limit)
        refreshes = refreshes.filter(source_id__in=limit)

    key_filter = _key_filter(q)
    if key_filter is not None:
        results.workers = _capped(workers.filter(key_filter).order_by(*_KEY_FIELDS, "source_id"))
    if _DIGITS.fullmatch(q):
        by_instance = workers.filter(instance_id__startswith=q)
        results.instances = _capped(by_instance.order_by("instance_id", "source_id", "pk"))
    refresh_id = _REFRESH_ID.fullmatch(q)
    if refresh_id:
        results.refreshes = _capped(refreshes.filter(pk=int(refresh_id.group(1))))
    results.versions = _versions(q, workers, refreshes)
    return results


def _key_filter(q: str) -> Q | None:
    """Leading parts of a worker key exactly, the last as a prefix; None when `q` cannot be one
    (more than four parts, or digits alone, which are an instance id)."""
    parts = q.split("/")
    if len(parts) > len(_KEY_FIELDS) or (len(parts) == 1 and _DIGITS.fullmatch(q)):
        return None
    *whole, last = parts
    lookups: dict[str, Any] = dict(zip(_KEY_FIELDS, whole, strict=False))
    if last:
        lookups[f"{_KEY_FIELDS[len(whole)]}__startswith"] = last
    return Q(**lookups)


def _capped[T](queryset: QuerySet[Any, T]) -> Group[T]:
    rows = list(queryset[: LIMIT + 1])
    return Group(hits=rows[:LIMIT], more=len(rows) > LIMIT)


class JsonText(Func):
    """A JSON scalar column as text (`"v2"` → `v2`, `1200` → `1200`), for a top-level value
    where `KT` needs a key."""

    output_field = TextField()
    template = "(%(expressions)s #>> '{}')"

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, template="json_extract(%(expressions)s, '$')")


def _versions(q: str, workers: QuerySet, refreshes: QuerySet) -> Group[VersionHit]:
    """Versions starting with `q` that a refresh targeted or a worker reports."""
    hits: dict[str, VersionHit] = {}
    for kind, rows, text in (
        ("targeted", refreshes, KT("target__weight_version")),
        ("reported", workers, JsonText("weight_version")),
    ):
        found = (
            rows.annotate(version_text=text)
            .filter(version_text__startswith=q)
            .values_list("version_text")
            .order_by("version_text")
            .distinct()[: LIMIT + 1]
        )
        for (value,) in found:
            # SQLite hands a number back as a number; the link and the trail use its text.
            version = version_key(value)
            setattr(hits.setdefault(version, VersionHit(version)), kind, True)
    versions = sorted(hits)
    return Group(hits=[hits[v] for v in versions[:LIMIT]], more=len(versions) > LIMIT)
