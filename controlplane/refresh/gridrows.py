"""The refresh page's worker-by-step grid rows and cells, built in Python.

A grid page is 100 workers by 5 step cells plus each worker's call timeline (a dot per call):
thousands of template lookups per page, and cells are pushed one by one as calls finish. Like
the source page's worker rows (`controlplane.fleet.rows`), this hot fragment is formatted
directly; every value it interpolates is escaped here and bidi controls are neutralised once
per call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import localtime

from controlplane.html import neutralize_bidi


# The rows' types live with their renderer: `presenters` builds them from the journal and calls
# this module, which imports nothing of the presenters back.
@dataclass
class Cell:
    worker_id: int
    step: str
    status: str = "pending"  # pending|running|ok|failed|skipped|unreached
    error: str = ""
    ms: float | None = None

    @property
    def dom_id(self) -> str:
        return f"cell-{self.worker_id}-{self.step}"


@dataclass
class GridRow:
    worker: Any
    cells: list[Cell] = field(default_factory=list)
    #: The worker's call timeline: one dict per journaled call, oldest first.
    calls: list[dict[str, Any]] = field(default_factory=list)


#: Statuses whose error is worth opening: the cell folds it under the status.
_FOLDED = frozenset({"failed", "unreached"})


def _ms(value: float | None) -> str:
    return f" <small>{value:.0f} ms</small>" if value else ""


def _cell(cell: Cell, oob: bool) -> str:
    status = escape(cell.status)
    title = f' title="{escape(cell.error)}"' if cell.error else ""
    swap = ' hx-swap-oob="true"' if oob else ""
    # Each cell opens the journal filtered to its worker and step (the page's `j_` filter).
    calls = (
        f'<a class="cell-calls" href="?j_worker={cell.worker_id}&amp;j_step='
        f'{escape(cell.step)}#refresh-journal" title="calls of this worker at this step">'
    )
    body = (
        f"<details><summary>{status}</summary>{escape(cell.error)} {calls}calls</a></details>"
        if cell.status in _FOLDED
        else f"{calls}{status}</a>"
    )
    return (
        f'<td id="{escape(cell.dom_id)}" class="cell {status}"{swap} data-status="{status}"'
        f"{title}>{body}{_ms(cell.ms)}</td>"
    )


def render_cells(cells: Iterable[Cell], *, oob: bool = False) -> SafeString:
    """Step cells; `oob` makes each an out-of-band swap for a websocket push."""
    # Safe: `_cell` escapes every value it interpolates.
    return mark_safe(neutralize_bidi("".join(_cell(c, oob) for c in cells)))


def _call(call: dict[str, Any]) -> str:
    at = call.get("at")
    when = f"{localtime(at):%H:%M:%S.%f}" if at is not None and hasattr(at, "tzinfo") else at
    title = f"{call['step']} {call['op']} {call['ms'] or 0:.0f} ms at {when}"
    return f'<span class="call {"ok" if call["ok"] else "failed"}" title="{escape(title)}"></span>'


def _row(row: GridRow) -> str:
    w = row.worker
    return (
        f'<tr id="worker-row-{w.pk}"><td><code>{escape(w.key)}</code> '
        f'<small class="muted">{escape(w.family)}</small></td>'
        f"{''.join(_cell(c, False) for c in row.cells)}"
        f'<td><div class="call-timeline" id="timeline-{w.pk}">'
        f"{''.join(_call(c) for c in row.calls)}</div></td></tr>"
    )


def render_grid(rows: list[GridRow], columns: int) -> SafeString:
    """The grid page's `<tr>`s (`columns` wide when empty)."""
    html = "".join(_row(r) for r in rows) or (
        f'<tr><td colspan="{columns}" class="empty">No worker matches.</td></tr>'
    )
    # Safe: `_row` escapes every value it interpolates; bidi neutralised once for the page.
    return mark_safe(neutralize_bidi(html))
