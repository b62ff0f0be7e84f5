"""The drill schedule's beat tick: start every due scheduled drill.

Above both `actions` (which starts a drill) and `runner` (which drives one and records what the
schedule skipped or was refused), so neither of them imports the other back.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError

from controlplane.refresh.drills import runner
from controlplane.refresh.drills.actions import start_drill
from controlplane.refresh.errors import RefreshConflict, RefreshError

__all__ = ["start_due_drills"]


def start_due_drills() -> list[int]:
    """Start every due scheduled drill. A source whose scope a refresh holds (running, waiting
    or held) or another drill runs on is skipped — nothing is recorded against the schedule,
    so it stays due and a later tick starts it once the scope is free; any other refusal is
    recorded as a failed drill, so the overview says why the schedule is not proving anything
    (and the next try waits a full interval)."""
    started: list[int] = []
    for source in runner.due_sources():
        try:
            drill = start_drill(source, actor=runner.SCHEDULE, scheduled=True)
        except RefreshConflict as exc:
            runner.record_skipped(source, exc.message)
            continue
        except (RefreshError, ValidationError) as exc:
            message = exc.message if isinstance(exc, RefreshError) else "; ".join(exc.messages)
            runner.record_refused(source, message)
            continue
        started.append(drill.pk)
    return started
