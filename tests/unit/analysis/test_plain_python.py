"""The statistics, metrics and judge are plain Python: no Django, no scipy or numpy at runtime
(scipy is a test-only reference), so they run anywhere the observations can be read."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ANALYSIS = Path(__file__).resolve().parents[3] / "controlplane" / "analysis"
ALLOWED_PROJECT_IMPORTS = {
    "controlplane.analysis.catalog",
    "controlplane.analysis.rules",
    "controlplane.analysis.stats",
    "controlplane.dynamo.observation",
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", ["stats.py", "metrics.py", "judge.py"])
def test_imports_only_the_standard_library_and_plain_project_modules(module):
    for name in _imports(ANALYSIS / module):
        top = name.split(".")[0]
        if top == "controlplane":
            assert name in ALLOWED_PROJECT_IMPORTS, f"{module} imports {name}"
        else:
            assert top in sys.stdlib_module_names or top == "__future__", f"{module} imports {name}"
