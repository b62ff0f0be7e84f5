"""`PolicyRefresh.resolved_namespaces` is read and updated through `refresh.namespaces` only."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from controlplane.refresh.namespaces import (
    FORCE_REOPENED,
    REOPENED,
    outcome_in,
    reopened_namespaces,
    resolved_of,
    resolved_summary,
    with_resolved,
)

ROOT = Path(__file__).resolve().parents[3] / "controlplane"


def _refresh(resolved=None):
    return SimpleNamespace(resolved_namespaces=resolved, namespaces=["rl-a", "rl-b", "rl-c"])


def test_resolving_adds_to_a_copy_and_keeps_earlier_namespaces():
    before = _refresh({"rl-a": {"outcome": FORCE_REOPENED, "by": "ana", "at": "t", "reason": "x"}})
    after = with_resolved(before, ["rl-b", "rl-c"], REOPENED, by="bo")
    assert set(after) == {"rl-a", "rl-b", "rl-c"}
    assert after["rl-b"]["outcome"] == REOPENED and after["rl-b"]["by"] == "bo"
    assert after["rl-b"]["at"] == after["rl-c"]["at"]
    assert set(before.resolved_namespaces) == {"rl-a"}  # the stored column is not touched
    assert resolved_of(_refresh(None)) == {}


def test_outcomes_and_summary_read_the_stored_shape():
    refresh = _refresh(with_resolved(_refresh(), ["rl-a"], FORCE_REOPENED, by="ana", reason="x"))
    refresh.resolved_namespaces.update(with_resolved(_refresh(), ["rl-b"], REOPENED, by="bo"))
    assert outcome_in(refresh.resolved_namespaces, "rl-a") == FORCE_REOPENED
    assert outcome_in(refresh.resolved_namespaces, "rl-c") == ""
    assert outcome_in(None, "rl-a") == ""
    assert reopened_namespaces(refresh) == {"rl-b"}
    assert resolved_summary(refresh) == "rl-a force-reopened by ana: x; rl-b reopened by bo"


def test_no_other_module_reads_the_column_in_place():
    in_place = re.compile(r"\.resolved_namespaces\s*(or\b|\[|\.get\(|\.items\(|\.keys\(|$)")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(ROOT.rglob("*.py"))
        if "/migrations/" not in str(path) and path.name != "namespaces.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if in_place.search(line)
    ]
    assert not found, found
