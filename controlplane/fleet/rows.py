"""The worker table's rows, column headers and pager, built in Python.

The source page renders a page of rows and the live push sends the same rows (the visible
page's `<tbody>`, or one row per changed worker), so this hot fragment is formatted
directly instead of through a template loop; everything else on the pages is ordinary
templates. Every value that reaches a row is escaped here, including our own enumerations
(state, liveness), so no column needs an argument about where its value came from. Bidi
controls are then neutralised once per call (`render_rows`: once for the whole table), like
every template's output (see `controlplane.html`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from django.core.paginator import Page
from django.urls import reverse
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import localtime

from controlplane.fleet.filters import WorkerFilter
from controlplane.fleet.models import Worker, WorkerEvent, WorkerEventKind
from controlplane.fleet.presenters import capabilities, route_groups, version_label
from controlplane.html import neutralize_bidi

HEADERS = (
    ("identity", "Worker"),
    ("namespace", "Namespace"),
    ("model", "Model"),
    ("system_url", "System URL"),
    (None, "Routes"),
    ("version", "Version"),
    ("liveness", "Liveness"),
    ("state", "State"),
    (None, "Error"),
)


@dataclass(frozen=True, slots=True)
class Header:
    label: str
    #: The query string that sorts by this column ("" for a column that does not sort).
    query: str = ""
    #: "▲" or "▼" on the column the table is sorted by.
    arrow: str = ""


def sort_headers(flt: WorkerFilter) -> list[Header]:
    """Column headers; each sortable one links to the same view sorted by it (page 1)."""
    headers = []
    for key, label in HEADERS:
        if key is None:
            headers.append(Header(label))
            continue
        arrow = ("▼" if flt.descending else "▲") if flt.sort == key else ""
        headers.append(Header(label, flt.sorted_by(key).query or "sort=identity", arrow))
    return headers


@dataclass(frozen=True, slots=True)
class Pager:
    number: int
    num_pages: int
    first: int
    last: int
    count: int
    previous_query: str = ""
    next_query: str = ""
    first_query: str = ""
    last_query: str = ""


class Paged(Protocol):
    """A view in the URL that can name its other pages (`WorkerFilter`, the refresh grid's)."""

    def with_page(self, page: int) -> Paged: ...

    @property
    def query(self) -> str: ...


def pager(flt: Paged, page: Page) -> Pager:
    """Where this page is among all matching rows, and the links to its neighbours."""
    n, total = page.number, page.paginator.num_pages

    def link(number: int) -> str:
        return flt.with_page(number).query or "page=1"

    return Pager(
        number=n,
        num_pages=total,
        first=page.start_index(),
        last=page.end_index(),
        count=page.paginator.count,
        previous_query=link(n - 1) if page.has_previous() else "",
        next_query=link(n + 1) if page.has_next() else "",
        first_query=link(1) if n > 2 else "",
        last_query=link(total) if n < total - 1 else "",
    )


def _routes_cell(w: Worker) -> str:
    routes = tuple(w.routes or ())
    if not routes:
        return '<span class="muted">none</span>'
    caps = " · ".join(
        f'<span class="cap {"on" if c.enabled else "off"}">{escape(c.label)}</span>'
        for c in capabilities(w.family, routes)
    )
    groups = "".join(
        f"<div><b>{escape(g)}</b> {escape(', '.join(rs))}</div>" for g, rs in route_groups(routes)
    )
    return (
        f"<details><summary>{len(routes)} route{'s' if len(routes) != 1 else ''} "
        f'<span class="muted">{escape(w.family or "unknown family")}</span></summary>'
        f'{groups}</details><div class="caps">{caps}</div>'
    )


def _version_cell(w: Worker) -> str:
    label = escape(version_label(w.weight_version))
    text = f"<code>{label}</code>" if w.version_probed_at else '<span class="muted">—</span>'
    if w.version_error:
        text += f'<div class="cell-error">{escape(w.version_error)}</div>'
    return text


@lru_cache(maxsize=64)
def _escaped_choice(value: str) -> str:
    # State and liveness come from a handful of choices: escape each once, not per row.
    return escape(value)


@lru_cache(maxsize=1)
def _worker_url_prefix() -> str:
    # reverse() per row costs more than the rest of the row at 2,000 rows.
    return reverse("fleet:worker", args=[1]).removesuffix("1/")


def render_row(w: Worker, *, oob: str = "") -> SafeString:
    """One `<tr>`; `oob` adds `hx-swap-oob` for a websocket push."""
    # Safe: `_row` escapes every value it interpolates.
    return mark_safe(neutralize_bidi(_row(w, oob)))


def render_rows(workers, *, oob: str = "") -> SafeString:
    # Safe: rows that `_row` escaped; bidi controls neutralised once for the whole table.
    return mark_safe(neutralize_bidi("".join(_row(w, oob) for w in workers)))


def _row(w: Worker, oob: str) -> str:
    url = _worker_url_prefix() + f"{w.pk}/"
    static = ' <span class="badge static">static</span>' if w.static_worker_id else ""
    liveness_error = (
        f'<div class="cell-error">{escape(w.liveness_error)}</div>' if w.liveness_error else ""
    )
    oob_attr = format_html(' hx-swap-oob="{}"', oob) if oob else ""
    state, liveness = _escaped_choice(w.state), _escaped_choice(w.liveness)
    return (
        f'<tr id="worker-{w.pk}" class="state-{state}" data-key="{escape(w.key)}"{oob_attr}>'
        f'<td><a href="{url}">{escape(w.component)}/{escape(w.endpoint)}</a>{static}'
        f'<div class="mono iid">{escape(w.instance_id)}</div></td>'
        f"<td>{escape(w.namespace)}</td>"
        f"<td>{escape(w.model) or '<span class="muted">—</span>'}</td>"
        f'<td class="mono">{escape(w.system_url) or '<span class="muted">none</span>'}</td>'
        f"<td>{_routes_cell(w)}</td>"
        f"<td>{_version_cell(w)}</td>"
        f'<td><span class="badge {liveness}">{liveness}</span>{liveness_error}</td>'
        f'<td><span class="badge {state}">{state}</span></td>'
        f'<td class="cell-error">{escape(w.error)}</td>'
        "</tr>"
    )


# -- the membership timeline (up to `live.TIMELINE_LIMIT` events, on the page and pushed) -------

_KIND_LABELS = dict(WorkerEventKind.choices)


def _event_details(e: WorkerEvent) -> str:
    details = e.details or {}
    if not details:
        return ""
    if e.kind in (WorkerEventKind.VERSION_CHANGED, WorkerEventKind.LIVENESS_CHANGED):
        text = f"{details.get('from') or 'none'} → {details.get('to') or 'none'}"
    elif e.kind == WorkerEventKind.STARTED_ERRORING:
        text = str(details.get("error", ""))
    elif e.kind == WorkerEventKind.CHANGED:
        text = ", ".join(str(f) for f in details.get("fields") or ())
    else:
        return ""
    return f' <span class="muted">{escape(text)}</span>'


def _event(e: WorkerEvent) -> str:
    at = localtime(e.occurred_at)
    kind = _escaped_choice(e.kind)
    return (
        f'<li class="event-{kind}"><time datetime="{at.isoformat()}">{at:%H:%M:%S}</time> '
        f'<span class="badge {kind}">{escape(_KIND_LABELS.get(e.kind, e.kind))}</span> '
        f'<a class="mono" href="{_worker_url_prefix()}{e.worker_id}/">{escape(e.worker.key)}</a>'
        f"{_event_details(e)}</li>"
    )


def render_timeline(events) -> SafeString:
    """The timeline's `<li>` items, newest first (events with their worker selected)."""
    items = "".join(_event(e) for e in events)
    if not items:
        items = '<li class="empty">No membership changes in the last day.</li>'
    # Safe: `_event` escapes every value it interpolates; bidi controls neutralised here.
    return mark_safe(neutralize_bidi(items))
