"""Limit/offset pages: `{"items": [...], "count": n, "limit": l, "offset": o}`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ninja import Schema
from pydantic import Field, create_model

MAX_LIMIT = 500
# Far beyond any real table, small enough that the database never sees an overflowing OFFSET.
MAX_OFFSET = 10_000_000


class PageParams(Schema):
    limit: int = Field(50, ge=1, le=MAX_LIMIT)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)


_PAGES: dict[type, type] = {}


def page_of(item: type[Schema]) -> type[Schema]:
    """The page schema for `item`, one class per item type (named for the OpenAPI schema)."""
    if item not in _PAGES:
        _PAGES[item] = create_model(
            f"{item.__name__.removesuffix('Out')}Page",
            __base__=Schema,
            items=(list[item], ...),  # type: ignore[valid-type]  # built per item type at run time
            count=(int, ...),
            limit=(int, ...),
            offset=(int, ...),
        )
    return _PAGES[item]


def paginate(queryset, page: PageParams, serialize: Callable[[Any], Any]) -> dict[str, Any]:
    count = queryset.count()
    rows = queryset[page.offset : page.offset + page.limit]
    return {
        "items": [serialize(row) for row in rows],
        "count": count,
        "limit": page.limit,
        "offset": page.offset,
    }
