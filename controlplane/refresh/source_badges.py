"""Per-source badges read once for every source a page lists.

The fleet overview renders one card per source, and each card's tags (gates, drift, drills)
would otherwise query for their own source: the page's cost would grow with the fleet. The
first card's tag instead reads every listed source (the view's `summaries`) in one go and keeps
the answer for the rest of the render; a lone card (a live push, the source page) reads its own.

The answer is kept in the render context's root, not its current level: the gate badges sit
in an included template, and every include starts a level of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def for_source[T](
    context: Any, key: object, source: Any, load: Callable[[Iterable[int]], dict[int, T]]
) -> T:
    """`load(source ids)[source.pk]`, loading every listed source's the first time."""
    root = context.render_context.dicts[0]
    known: dict[int, T] | None = root.get(key)
    if known is None or source.pk not in known:
        listed = {summary.source.pk for summary in context.get("summaries") or ()}
        known = load(listed | {source.pk})
        root[key] = known
    return known[source.pk]
