"""Start-up stage lines: each carries the elapsed seconds and is flushed as it is written."""

import re

from controlplane.embedded.progress import Stages


def test_each_stage_line_is_flushed_at_once_with_its_elapsed_seconds(monkeypatch):
    clock = iter([100.0, 100.04, 112.5, 112.5])
    monkeypatch.setattr("controlplane.embedded.progress.time.monotonic", lambda: next(clock))
    events: list[tuple[str, str]] = []
    stages = Stages(
        lambda text: events.append(("write", text)), lambda: events.append(("flush", ""))
    )
    stages.stage("Starting embedded Redis")
    stages.stage("Migrating the database")
    assert events == [
        ("write", "[  0.0 s] Starting embedded Redis"),
        ("flush", ""),
        ("write", "[ 12.5 s] Migrating the database"),
        ("flush", ""),
    ]
    assert stages.elapsed() == 12.5
    assert all(re.match(r"^\[\s*\d+\.\d s\] ", text) for kind, text in events if kind == "write")
