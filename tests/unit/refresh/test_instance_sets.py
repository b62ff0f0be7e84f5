"""`Gate.instance_sets` is read and written by `refresh.gates` only (`StagedHeader`)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from controlplane.refresh.gates import InstanceSets, StagedHeader, staged_header

ROOT = Path(__file__).resolve().parents[3] / "controlplane"


def test_the_stored_header_is_read_as_a_copy():
    gate = SimpleNamespace(instance_sets=StagedHeader(refresh_id=7, wave=1, waves=3))
    header = staged_header(gate)
    header["wave"] = 2
    assert gate.instance_sets["wave"] == 1
    assert staged_header(SimpleNamespace(instance_sets=None)) == {}


def test_the_derived_sets_extend_the_stored_header():
    assert set(StagedHeader.__annotations__) < set(InstanceSets.__annotations__)


def test_no_other_module_reads_the_column_in_place():
    in_place = re.compile(r"\.instance_sets\s*(or\b|\[|\.get\(|$)")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(ROOT.rglob("*.py"))
        if "/migrations/" not in str(path) and path.name != "gates.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if in_place.search(line)
    ]
    assert not found, found
