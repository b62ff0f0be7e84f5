"""The refresh app's models (app label `refresh`; tables and migrations as they were).

`refresh` holds the policy refresh, its plan, journal, gates and quarantines; `ledger` the
serving ledger; `drill` the rollback drill. Every model is imported here, so Django registers
them and the rest of the project (and audit rows, which name models by label) keeps one place
to take them from.
"""

from controlplane.refresh.models.analysis import (
    AnalysisPhase,
    AnalysisRunState,
    CanaryAnalysis,
    CanaryReport,
    WatchReport,
)
from controlplane.refresh.models.drill import (
    DrillOutcome,
    DrillPhase,
    DrillRun,
)
from controlplane.refresh.models.ledger import (
    VERIFIED_EVIDENCE,
    Admission,
    Evidence,
    Serving,
    ServingInterval,
)
from controlplane.refresh.models.refresh import (
    ACTIVE_STATES,
    ADMITTING_STATES,
    EXECUTING_STATES,
    HELD_QUARANTINE_STATES,
    LEDGER_STATES,
    OPEN_QUARANTINE_STATES,
    TERMINAL_STATES,
    WAITING_STATES,
    Closure,
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
    "LEDGER_STATES",
    "OPEN_QUARANTINE_STATES",
    "TERMINAL_STATES",
    "VERIFIED_EVIDENCE",
    "WAITING_STATES",
    "Admission",
    "AnalysisPhase",
    "AnalysisRunState",
    "CanaryAnalysis",
    "CanaryReport",
    "Closure",
    "DrillOutcome",
    "DrillPhase",
    "DrillRun",
    "Evidence",
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
    "Serving",
    "ServingInterval",
    "StepRun",
    "WatchReport",
    "WorkerStepResult",
    "state_change",
]
