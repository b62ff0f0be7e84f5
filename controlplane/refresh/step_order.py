"""The ordered steps of a policy refresh and the state each one runs in."""

from enum import StrEnum

from controlplane.refresh.models import RefreshState


class StepName(StrEnum):
    GATE = "gate"
    RESOLVE = "resolve"
    PAUSE = "pause"
    UPDATE = "update"
    FLUSH = "flush"
    RESUME_ENGINES = "resume_engines"
    VERIFY = "verify"
    REOPEN = "reopen"
    # Closing out a held or aborted refresh: resume what it paused.
    RELEASE = "release"
    # A canary that failed: its workers go back to the gate's old policy before the hold.
    CANARY_ROLLBACK = "canary_rollback"


STEP_STATE: dict[StepName, RefreshState] = {
    StepName.GATE: RefreshState.GATING,
    StepName.RESOLVE: RefreshState.RESOLVING,
    StepName.PAUSE: RefreshState.PAUSING,
    StepName.UPDATE: RefreshState.UPDATING,
    StepName.FLUSH: RefreshState.FLUSHING,
    StepName.RESUME_ENGINES: RefreshState.RESUMING_ENGINES,
    StepName.VERIFY: RefreshState.VERIFYING,
    StepName.REOPEN: RefreshState.REOPENING,
    StepName.RELEASE: RefreshState.RELEASING,
    StepName.CANARY_ROLLBACK: RefreshState.CANARY_ROLLBACK,
}
STATE_STEP = {state: step for step, state in STEP_STATE.items()}

#: The main sequence, in order. RELEASE and CANARY_ROLLBACK are not part of it.
ORDER: tuple[StepName, ...] = (
    StepName.GATE,
    StepName.RESOLVE,
    StepName.PAUSE,
    StepName.UPDATE,
    StepName.FLUSH,
    StepName.RESUME_ENGINES,
    StepName.VERIFY,
    StepName.REOPEN,
)
#: Steps that call every planned worker (one grid column each).
WORKER_STEPS: tuple[StepName, ...] = (
    StepName.PAUSE,
    StepName.UPDATE,
    StepName.FLUSH,
    StepName.RESUME_ENGINES,
    StepName.VERIFY,
)

STEP_LABELS = {
    StepName.GATE: "Close gate",
    StepName.RESOLVE: "Resolve membership",
    StepName.PAUSE: "Pause",
    StepName.UPDATE: "Update weights",
    StepName.FLUSH: "Flush cache",
    StepName.RESUME_ENGINES: "Resume engines",
    StepName.VERIFY: "Verify",
    StepName.REOPEN: "Re-resolve and reopen",
    StepName.RELEASE: "Release (resume engines)",
    StepName.CANARY_ROLLBACK: "Roll the canary back",
}


def next_step(step: StepName) -> StepName | None:
    index = ORDER.index(step)
    return ORDER[index + 1] if index + 1 < len(ORDER) else None
