"""`loads_bounded` refuses nesting past the limit whichever path judges it: the bracket count
that lets shallow documents skip the walk, or the walk that ignores brackets inside strings."""

from __future__ import annotations

import pytest

from controlplane.dynamo.jsonsafe import UnsafeJSON, loads_bounded


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [1, 8, 9])
def test_the_limit_is_exact(depth):
    if depth <= 8:
        assert loads_bounded(nested(depth), max_depth=8) is not None
    else:
        with pytest.raises(UnsafeJSON) as refused:
            loads_bounded(nested(depth), max_depth=8)
        assert refused.value.code == "json_too_deep"


def test_many_brackets_inside_strings_do_not_count_as_nesting():
    # More brackets than the limit, so the count alone cannot clear it: the walk must.
    text = '{"a": "' + "[[[[{{{{" * 4 + '", "b": [[1]]}'
    assert loads_bounded(text, max_depth=4) == {"a": "[[[[{{{{" * 4, "b": [[1]]}


def test_wide_but_shallow_documents_pass_and_deep_ones_do_not():
    wide = "[" + ",".join(["[1]"] * 500) + "]"
    assert len(loads_bounded(wide, max_depth=2)) == 500
    with pytest.raises(UnsafeJSON):
        loads_bounded("[" + ",".join(["[[1]]"] * 500) + "]", max_depth=2)
