"""Response schemas derived from the dataclasses they serialize, so a field added to the
dataclass is in the API (and its OpenAPI schema) without a second edit.

`schema_of(Checkpoint, "CheckpointOut")` makes a `ninja.Schema` with one field per dataclass
field, typed by its annotation. Nested dataclasses (or models) become their own schemas
through `nested` (`{WorkerOutcome: WorkerOutcomeOut}`, also inside `list[...]` and
`dict[..., ...]`); `properties` adds read-only properties the response carries (typed by their
return annotation); `exclude` leaves out fields the serializer flattens or drops.

Every field is required, as the serializer always writes it, whatever default the dataclass
has for building it; an `Any` field (any JSON value, null included) defaults to None.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from ninja import Schema
from pydantic import create_model


def _substitute(tp: Any, nested: dict[Any, Any]) -> Any:
    if tp in nested:
        return nested[tp]
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if not args or origin is None:
        return tp
    new = tuple(_substitute(a, nested) for a in args)
    if origin in (list, dict, tuple, set, frozenset):
        return origin[new]
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return typing.Union[new]  # noqa: UP007 (rebuilding a union from its parts)
    return tp


def schema_of(
    source: type,
    name: str,
    *,
    base: type[Schema] = Schema,
    nested: dict[Any, Any] | None = None,
    properties: tuple[str, ...] = (),
    exclude: frozenset[str] = frozenset(),
) -> type[Schema]:
    nested = nested or {}
    hints = typing.get_type_hints(source)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(source):
        if f.name in exclude:
            continue
        tp = _substitute(hints[f.name], nested)
        fields[f.name] = (tp, None) if tp is Any else (tp, ...)
    for prop in properties:
        getter = getattr(source, prop).fget
        fields[prop] = (typing.get_type_hints(getter)["return"], ...)
    return create_model(name, __base__=base, __module__=source.__module__, **fields)
