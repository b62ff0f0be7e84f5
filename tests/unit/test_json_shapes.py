"""Every JSON column has a declared shape (`controlplane/jsonshapes.py`), and the validator the
conformance test uses catches what a writer gets wrong: an undeclared key, a missing one, a
value of the wrong type, at any depth."""

from __future__ import annotations

from typing import (
    Any,
    NotRequired,
    Required,
    TypedDict,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import pytest
from django.apps import apps
from django.db import models

from controlplane.jsonshapes import SHAPES, problems
from controlplane.jsontypes import OpaqueJson, WeightVersion, WorkerKeys


def _json_columns() -> set[str]:
    return {
        f"{model._meta.label}.{field.name}"
        for model in apps.get_models()
        if model.__module__.startswith("controlplane")
        for field in model._meta.get_fields()
        if isinstance(field, models.JSONField)
    }


def test_every_json_column_has_a_registered_shape():
    missing = sorted(_json_columns() - set(SHAPES))
    assert not missing, (
        f"JSON columns without a declared shape: {missing}. Declare a TypedDict (or alias) in "
        "the module that owns the column's keys and register it in controlplane/jsonshapes.py"
    )


def test_the_registry_names_only_columns_that_exist():
    assert not sorted(set(SHAPES) - _json_columns())


def _parts(shape: Any, seen: set[int]) -> list[Any]:
    """Every shape reachable from `shape` (TypedDict values, list and union members)."""
    if id(shape) in seen:
        return []
    seen.add(id(shape))
    out = [shape]
    if hasattr(shape, "__value__"):
        out += _parts(shape.__value__, seen)
    for arg in get_args(shape):
        out += _parts(arg, seen)
    if is_typeddict(shape):
        for hint in get_type_hints(shape, include_extras=True).values():
            out += _parts(hint, seen)
    return out


@pytest.mark.parametrize("column", sorted(SHAPES))
def test_every_shape_is_one_the_validator_can_check(column):
    """No shape the validator would refuse (a set, a tuple, a class it cannot read): each
    reachable part is checked against a value of the wrong kind without a TypeError."""
    for part in _parts(SHAPES[column], set()):
        if get_origin(part) in (Required, NotRequired) or part is Ellipsis:
            continue
        problems(object(), part)


# -- the validator ------------------------------------------------------------------------------
class Inner(TypedDict):
    name: str
    count: int


class Outer(TypedDict, total=False):
    kind: Required[str]
    ratio: float
    flag: bool
    inner: Inner
    items: list[Inner]
    by_name: dict[str, list[str]]
    maybe: int | None
    extra: NotRequired[str]
    version: WeightVersion
    raw: OpaqueJson


class Base(TypedDict):
    a: str


class Derived(Base, total=False):
    b: int


GOOD: dict[str, Any] = {
    "kind": "waves",
    "ratio": 1,  # an integer is a number
    "flag": False,
    "inner": {"name": "x", "count": 2},
    "items": [{"name": "y", "count": 0}],
    "by_name": {"a": ["1", "2"]},
    "maybe": None,
    "version": {"anything": ["a trainer sends"]},
    "raw": [1, "two", {"three": None}],
}


def test_a_value_that_fits_has_no_problems():
    assert problems(GOOD, Outer) == []
    assert problems({"kind": "all"}, Outer) == []  # optional keys may be absent


def test_a_key_the_shape_does_not_declare_is_a_problem():
    """What the conformance test relies on: a writer that adds an undeclared key fails."""
    assert problems({**GOOD, "surprise": 1}, Outer) == ["$: Outer has no key 'surprise'"]
    nested = {**GOOD, "items": [{"name": "y", "count": 0, "extra": True}]}
    assert problems(nested, Outer) == ["$.items[0]: Inner has no key 'extra'"]


def test_a_missing_required_key_is_a_problem():
    assert problems({"ratio": 0.5}, Outer) == ["$: Outer needs 'kind'"]
    assert problems({**GOOD, "inner": {"name": "x"}}, Outer) == ["$.inner: Inner needs 'count'"]


def test_values_are_checked_by_json_type():
    assert problems({**GOOD, "kind": 3}, Outer) == ["$.kind: expected str, got int"]
    assert problems({**GOOD, "ratio": True}, Outer) == ["$.ratio: expected float, got bool"]
    assert problems({**GOOD, "flag": 0}, Outer) == ["$.flag: expected bool, got int"]
    assert problems({**GOOD, "inner": {"name": "x", "count": False}}, Outer) == [
        "$.inner.count: expected int, got bool"
    ]
    assert problems({**GOOD, "by_name": {"a": [1]}}, Outer) == [
        "$.by_name.a[0]: expected str, got int"
    ]
    assert problems({**GOOD, "maybe": "1"}, Outer) == ["$.maybe: expected int, got str"]
    assert problems({**GOOD, "items": {}}, Outer) == ["$.items: expected a list, got dict"]


def test_aliases_check_their_elements_and_opaque_data_is_not_looked_into():
    assert problems(["ns/c/e/1"], WorkerKeys) == []
    assert problems(["ns/c/e/1", 7], WorkerKeys) == ["$[1]: expected str, got int"]
    assert problems({"whatever": object()}, OpaqueJson) == []


def test_keys_inherited_from_a_total_base_stay_required():
    assert problems({"b": 1}, Derived) == ["$: Derived needs 'a'"]
    assert problems({"a": "x"}, Derived) == []


def test_a_registered_column_catches_an_undeclared_key():
    target = {"weight_version": "v2", "method": "disk", "model_path": "/ckpt"}
    assert problems(target, SHAPES["refresh.PolicyRefresh.target"]) == []
    assert problems({**target, "mdoel_path": "/x"}, SHAPES["refresh.PolicyRefresh.target"]) == [
        "$: Target has no key 'mdoel_path'"
    ]
    entry = {"key": "a/b/c/1", "instance_id": "1", "kind": "version", "detail": "", "state": "q"}
    assert problems([entry], SHAPES["refresh.Gate.drift"]) == []
    assert problems([{**entry, "since": "now"}], SHAPES["refresh.Gate.drift"]) == [
        "$[0]: DriftEntry has no key 'since'"
    ]
