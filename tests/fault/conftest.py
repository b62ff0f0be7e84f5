"""The fault suite: real Redis, PostgreSQL and Celery broken on purpose under a running product.

Every test here is marked `fault` and reports its figures through `fault_report`. At the end of
the run the suite prints itself as one named, counted block (see `.ci/run`'s output), so a
reader sees how many fault scenarios ran, how each ended, and the figures each one measured:
lost deliveries, refreshes held by a transient fault, paused workers without an owner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

_FIGURES = pytest.StashKey[list[tuple[str, dict[str, Any]]]]()
_OUTCOMES = pytest.StashKey[dict[str, str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/fault/"):
            item.add_marker(pytest.mark.fault)


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Record a scenario's figures: `fault_report(lost_deliveries=0, held_by_transient=0, ...)`."""

    def report(**figures: Any) -> None:
        request.config.stash.setdefault(_FIGURES, []).append((request.node.nodeid, figures))

    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not report.nodeid.startswith("tests/fault/"):
        return
    # Keep the worst phase's outcome: a failing setup or teardown fails the scenario.
    if report.when == "call" or report.outcome != "passed":
        outcomes = _config.stash.setdefault(_OUTCOMES, {}) if _config else {}
        if report.when == "call" or report.nodeid not in outcomes:
            outcomes[report.nodeid] = report.outcome


_config: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    outcomes = config.stash.get(_OUTCOMES, {})
    if not outcomes:
        return
    figures = config.stash.get(_FIGURES, [])
    passed = sum(1 for outcome in outcomes.values() if outcome == "passed")
    terminalreporter.section(f"fault suite: {len(outcomes)} scenarios, {passed} passed")
    for nodeid, outcome in sorted(outcomes.items()):
        terminalreporter.write_line(f"{outcome:>7}  {nodeid}")
        for name, values in figures:
            if name == nodeid:
                line = ", ".join(f"{key}={value}" for key, value in values.items())
                terminalreporter.write_line(f"         {line}")
