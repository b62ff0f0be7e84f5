"""The worker table's filters and sort order, shared by the source page and its live stream.

The websocket consumer parses the same query string as the page, so a pushed row is shown,
replaced or removed exactly as a reload would.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import QueryDict

from controlplane.fleet.models import Worker
from controlplane.fleet.presenters import version_label

SORTS = {
    "identity": lambda w: (w.namespace, w.component, w.endpoint, int(w.instance_id)),
    "namespace": lambda w: (w.namespace, w.component, int(w.instance_id)),
    "model": lambda w: (w.model, w.namespace, int(w.instance_id)),
    "system_url": lambda w: (w.system_url, int(w.instance_id)),
    "version": lambda w: (version_label(w.weight_version), w.namespace, int(w.instance_id)),
    "liveness": lambda w: (w.liveness, w.namespace, int(w.instance_id)),
    "state": lambda w: (w.state, w.namespace, int(w.instance_id)),
}
DEFAULT_SORT = "identity"


@dataclass(frozen=True, slots=True)
class WorkerFilter:
    namespace: str = ""
    state: str = ""
    version: str = ""
    route: str = ""
    sort: str = DEFAULT_SORT
    descending: bool = False

    @classmethod
    def from_query(cls, query: QueryDict) -> WorkerFilter:
        sort = query.get("sort", DEFAULT_SORT)
        descending = sort.startswith("-")
        sort = sort.removeprefix("-")
        return cls(
            namespace=query.get("namespace", "").strip(),
            state=query.get("state", "").strip(),
            version=query.get("version", "").strip(),
            route=query.get("route", "").strip(),
            sort=sort if sort in SORTS else DEFAULT_SORT,
            descending=descending,
        )

    @property
    def narrows(self) -> bool:
        return bool(self.namespace or self.state or self.version or self.route)

    def matches(self, w: Worker) -> bool:
        return (
            (not self.namespace or w.namespace == self.namespace)
            and (not self.state or w.state == self.state)
            and (not self.version or version_label(w.weight_version) == self.version)
            and (not self.route or self.route in (w.routes or ()))
        )

    def apply(self, workers) -> list[Worker]:
        """Filter and sort already-loaded workers (one query, however they are filtered)."""
        rows = [w for w in workers if self.matches(w)]
        rows.sort(key=SORTS[self.sort], reverse=self.descending)
        return rows
