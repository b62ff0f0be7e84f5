"""The refresh app's models (app label `refresh`; tables and migrations as they were).

`refresh` holds the policy refresh, its plan, journal, gates and quarantines; `drill` the
rollback drill. Every model is imported here, so Django registers them and the rest of the
project (and audit rows, which name models by label) keeps one place to take them from.
"""

from controlplane.refresh.models.drill import (
    DrillOutcome,
    DrillPhase,
    DrillRun,
)
from controlplane.refresh.models.refresh import (
    ACTIVE_STATES,
    ADMITTING_STATES,
    EXECUTING_STATES,
    HELD_QUARANTINE_STATES,
    OPEN_QUARANTINE_STATES,
    TERMINAL_STATES,
    WAITING_STATES,
    FlushPolicy,
    Gate,
    GateState,
    JournalEntry,
    PauseMode,
    PlannedWorker,
    PolicyRefresh,
    Quarantine,
    QuarantineCall,
    QuarantineState,
    RefreshState,
    ScopeLock,
    StepRun,
    WorkerStepResult,
    state_change,
)

__all__ = [
    "ACTIVE_STATES",
    "ADMITTING_STATES",
    "EXECUTING_STATES",
    "HELD_QUARANTINE_STATES",
    "OPEN_QUARANTINE_STATES",
    "TERMINAL_STATES",
    "WAITING_STATES",
    "DrillOutcome",
    "DrillPhase",
    "DrillRun",
    "FlushPolicy",
    "Gate",
    "GateState",
    "JournalEntry",
    "PauseMode",
    "PlannedWorker",
    "PolicyRefresh",
    "Quarantine",
    "QuarantineCall",
    "QuarantineState",
    "RefreshState",
    "ScopeLock",
    "StepRun",
    "WorkerStepResult",
    "state_change",
]
