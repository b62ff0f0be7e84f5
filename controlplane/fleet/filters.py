"""The worker table's filters, search, sort order and paging, shared by the source page and its
live stream.

The database does the filtering, sorting and paging: a page of 2,000 workers loads and renders
one page (`PAGE_SIZE` rows), never the fleet. Every parameter lives in the URL, so a filtered,
sorted page is a link. The live stream parses the same query string and judges a pushed row
with `matches`, the same predicate in Python, so a pushed row is shown, replaced or removed
exactly as a reload would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import F, JSONNull, Q, QuerySet
from django.db.models.functions import Length
from django.http import QueryDict

from controlplane.fleet.models import Source, Worker

#: Rows per page. 100 rows of the worker table are ~90 KB of HTML: the first screen stays
#: well under the 250 KB budget and renders in a few milliseconds.
PAGE_SIZE = 100
#: A search longer than any worker name could be is cut, not refused: it matches nothing.
SEARCH_MAX = 200

# Instance ids are decimal text without leading zeros (`instance_id_validator`), so ordering
# by (length, text) is numeric order, in the database, for ids beyond 2^63.
_IID = ("#len", "instance_id")

#: Sort key → columns, most significant first. JSON versions sort by the database's JSON order
#: (strings alphabetically among themselves); `pk` last keeps pages stable under ties.
SORTS: dict[str, tuple[str, ...]] = {
    "identity": ("namespace", "component", "endpoint", *_IID),
    "namespace": ("namespace", "component", *_IID),
    "model": ("model", "namespace", *_IID),
    "system_url": ("system_url", *_IID),
    "version": ("weight_version", "namespace", *_IID),
    "liveness": ("liveness", "namespace", *_IID),
    "state": ("state", "namespace", *_IID),
}
DEFAULT_SORT = "identity"


def parse_page(value: str | None) -> int:
    """A page number from the URL; anything but a positive integer is page 1."""
    try:
        page = int(value or 1)
    except ValueError:
        return 1
    return page if page > 0 else 1


def paginate(queryset: QuerySet, number: int, size: int = PAGE_SIZE) -> Page:
    """One page (a number past the end shows the last page): a count and one slice."""
    return Paginator(queryset, size).get_page(number)


def _order(sort: str, descending: bool) -> list:
    columns = []
    for name in (*SORTS[sort], "pk"):
        expr = Length("instance_id") if name == "#len" else F(name)
        columns.append(expr.desc() if descending else expr.asc())
    return columns


def _version_q(label: str) -> Q:
    """Workers whose `version_label` is `label` (a label stands for a string or a JSON value)."""
    if label == "undeclared":
        return Q(weight_version__isnull=True) | Q(weight_version=JSONNull()) | Q(weight_version="")
    q = Q(weight_version=label)
    try:
        parsed = json.loads(label)
    except ValueError:
        return q
    return q if isinstance(parsed, str) else q | Q(weight_version=parsed)


def _route_q(route: str) -> Q:
    if connection.features.supports_json_field_contains:
        return Q(routes__contains=[route])
    # SQLite (the embedded default) has no JSON containment: match the quoted route in the
    # stored JSON text. Case-insensitive there, which only ever shows a route too many.
    return Q(routes__icontains=json.dumps(route))


@dataclass(frozen=True, slots=True)
class WorkerFilter:
    namespace: str = ""
    state: str = ""
    version: str = ""
    route: str = ""
    #: Free-text search over instance id, namespace, component, endpoint and model.
    q: str = ""
    sort: str = DEFAULT_SORT
    descending: bool = False
    page: int = 1

    @classmethod
    def from_query(cls, query: QueryDict | Mapping[str, str]) -> WorkerFilter:
        sort = query.get("sort") or DEFAULT_SORT
        descending = sort.startswith("-")
        sort = sort.removeprefix("-")
        return cls(
            namespace=(query.get("namespace") or "").strip(),
            state=(query.get("state") or "").strip(),
            version=(query.get("version") or "").strip(),
            route=(query.get("route") or "").strip(),
            q=(query.get("q") or "").strip()[:SEARCH_MAX],
            sort=sort if sort in SORTS else DEFAULT_SORT,
            descending=descending,
            page=parse_page(query.get("page")),
        )

    @property
    def narrows(self) -> bool:
        return bool(self.namespace or self.state or self.version or self.route or self.q)

    # -- the URL ---------------------------------------------------------------------------

    def params(self) -> dict[str, str]:
        """The non-default parameters, in a fixed order (one URL per view)."""
        pairs = {
            "namespace": self.namespace,
            "state": self.state,
            "version": self.version,
            "route": self.route,
            "q": self.q,
        }
        out = {k: v for k, v in pairs.items() if v}
        if self.sort != DEFAULT_SORT or self.descending:
            out["sort"] = f"{'-' if self.descending else ''}{self.sort}"
        if self.page != 1:
            out["page"] = str(self.page)
        return out

    @property
    def query(self) -> str:
        return urlencode(self.params())

    def with_page(self, page: int) -> WorkerFilter:
        return replace(self, page=page)

    def sorted_by(self, key: str) -> WorkerFilter:
        """Sort by `key`; asking again for the current key flips the direction. Back to page 1."""
        descending = self.sort == key and not self.descending
        return replace(self, sort=key, descending=descending, page=1)

    # -- the database ----------------------------------------------------------------------

    def queryset(self, source: Source | int) -> QuerySet[Worker]:
        workers = Worker.objects.filter(source=source)
        if self.namespace:
            workers = workers.filter(namespace=self.namespace)
        if self.state:
            workers = workers.filter(state=self.state)
        if self.version:
            workers = workers.filter(_version_q(self.version))
        if self.route:
            workers = workers.filter(_route_q(self.route))
        if self.q:
            workers = workers.filter(
                Q(instance_id__icontains=self.q)
                | Q(namespace__icontains=self.q)
                | Q(component__icontains=self.q)
                | Q(endpoint__icontains=self.q)
                | Q(model__icontains=self.q)
            )
        # The table never shows transport details; skipping them saves JSON decoding per row.
        return workers.defer("transport", "request_plane_url").order_by(
            *_order(self.sort, self.descending)
        )

    def page_of(self, source: Source | int) -> Page:
        return paginate(self.queryset(source), self.page)

    # -- a pushed row ----------------------------------------------------------------------

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether a pushed row (`live.row_payload`) belongs in this view, as `queryset` says."""
        needle = self.q.casefold()
        return (
            (not self.namespace or row["namespace"] == self.namespace)
            and (not self.state or row["state"] == self.state)
            and (not self.version or row["version"] == self.version)
            and (not self.route or self.route in row["routes"])
            and (
                not needle
                or any(
                    needle in str(row[k]).casefold()
                    for k in ("instance_id", "namespace", "component", "endpoint", "model")
                )
            )
        )
