"""The import graph of controlplane/ has no cycle and few hidden arrows (.ci/check-cycles).

Counted with imports inside functions, `if TYPE_CHECKING:` blocks excluded. The check's own
functions are run here so a new cycle or late import fails the suite, not only CI.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check():
    loader = importlib.machinery.SourceFileLoader("check_cycles", str(ROOT / ".ci/check-cycles"))
    spec = importlib.util.spec_from_loader("check_cycles", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("controlplane", exclude_type_checking_imports=True)


def test_no_import_cycle_in_controlplane(check, graph):
    assert check.cycles(graph) == []


def test_no_cycle_through_package_faces(check):
    """Counting the package `__init__` an import runs first: `namespaces` took two queries from
    `executor.departures`, whose package face imports the runner, whose steps import
    `namespaces` (an import error when the drill history was imported first)."""
    found = check.cycles(check.build_graph())
    assert found == [], found


@pytest.mark.parametrize(
    "first", ["controlplane.refresh.tasks", "controlplane.refresh.drill_history"]
)
def test_refresh_modules_import_first_in_a_fresh_process(first):
    code = f"import django; django.setup(); import {first}"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings"},
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("controlplane.realtime.fanout", "controlplane.realtime.streams"),
        ("controlplane.refresh.executor.distributed", "controlplane.refresh.executor.steps"),
        ("controlplane.refresh.gridrows", "controlplane.refresh.presenters"),
    ],
)
def test_lower_module_does_not_reach_up_even_for_types(importer, imported):
    """The small cycles were hidden behind TYPE_CHECKING; counted with them, they are gone."""
    with_types = grimp.build_graph("controlplane", exclude_type_checking_imports=False)
    assert not with_types.direct_import_exists(importer=importer, imported=imported)


def test_few_project_imports_inside_functions(check):
    late = check.late_imports()
    assert len(late) <= check.LATE_IMPORT_BOUND, late


def test_late_import_count_sees_function_imports(check, tmp_path, monkeypatch):
    """The counter itself: a project import in a function counts, one in `ready()` does not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "import pkg.a\n"
        "def f():\n    from pkg import b\n"
        "class C:\n    def ready(self):\n        import pkg.c\n"
        "    def other(self):\n        from . import d\n"
    )
    monkeypatch.setattr(check, "ROOT", tmp_path)
    assert check.late_imports("pkg") == ["pkg/m.py:3: pkg", "pkg/m.py:8: ."]


def test_import_contracts_hold():
    """import-linter's contracts, among them: nothing imports the refresh tasks module, and
    refresh/ keeps its layers (every module of it placed in one)."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports"))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Nothing imports the refresh tasks" in done.stdout
    assert "refresh/ is layered" in done.stdout
