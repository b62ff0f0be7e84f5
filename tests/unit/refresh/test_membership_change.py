"""`PolicyRefresh.membership_change` is read through `refresh.membership` only."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from controlplane.refresh.membership import (
    ChangedWorker,
    MembershipChange,
    change_of,
    changed_details,
    dropped_keys,
    has_change,
    left_out_keys,
)

ROOT = Path(__file__).resolve().parents[3] / "controlplane"
CHANGE = MembershipChange(
    step="reopen",
    namespaces=["rl-a"],
    left=["rl-a/b/g/1"],
    joined=["rl-a/b/g/9"],
    changed=[ChangedWorker(key="rl-a/b/g/2", detail="listed with an error: boom")],
)


def test_a_passed_check_stores_no_change():
    assert change_of(SimpleNamespace(membership_change=None)) == {}
    assert not has_change(MembershipChange(step="resolve", left=[], joined=[], changed=[]))


def test_resolving_drops_leavers_and_changed_and_leaves_joiners_and_changed_out():
    assert has_change(CHANGE)
    assert dropped_keys(CHANGE) == {"rl-a/b/g/1", "rl-a/b/g/2"}
    assert left_out_keys(CHANGE) == {"rl-a/b/g/9", "rl-a/b/g/2"}
    assert changed_details(CHANGE) == {"rl-a/b/g/2": "listed with an error: boom"}


def test_no_other_module_reads_the_column_in_place():
    in_place = re.compile(r"\.membership_change\s*(or\b|\[|\.get\(|$)")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(ROOT.rglob("*.py"))
        if "/migrations/" not in str(path) and path.name != "membership.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if in_place.search(line)
    ]
    assert not found, found
