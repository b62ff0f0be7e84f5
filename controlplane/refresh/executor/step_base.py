"""The types every step shares: its result, its context, and what a worker step offers.

Below both `steps` (the step objects) and `distributed` (the group update one of them runs), so
the update can build results and call back into its step without importing `steps`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.refresh.executor.calls import CallSettings, WorkerJob
from controlplane.refresh.executor.journal import StepJournal
from controlplane.refresh.executor.lease import Lease
from controlplane.refresh.models import PlannedWorker, PolicyRefresh
from controlplane.refresh.step_order import StepName

__all__ = ["JobsStep", "Step", "StepContext", "StepResult"]


@dataclass(frozen=True)
class StepResult:
    ok: bool
    reason: str = ""
    detail: str = ""
    aborted: bool = False
    #: The step moved the refresh into a waiting state and gave its lease up (an external
    #: update waiting for the trainer's report): the runner records the step and stops.
    waiting: bool = False


@dataclass
class StepContext:
    refresh: PolicyRefresh
    lease: Lease
    cfg: CallSettings
    attempt: int
    #: This executor took the refresh over mid-step from one that died.
    takeover: bool = False
    #: The verify step's passing generation replies of this attempt, as its calls decoded
    #: them: planned worker id → (key, request body, reply). The agreement check takes them
    #: from here instead of decoding the same bodies again from the journal it just wrote.
    generation_replies: dict[int, tuple[str, Any, Any]] | None = None


class Step:
    name: StepName

    def run(self, ctx: StepContext) -> StepResult:
        raise NotImplementedError


class JobsStep(Protocol):
    """What a step that calls workers offers the code running its calls (`distributed`)."""

    name: StepName

    def job(self, ctx: StepContext, worker: PlannedWorker, step: str | None = None) -> WorkerJob:
        """The call this step makes on `worker` (`step` names another route, e.g. a join)."""
        ...

    def judge(self, journal: StepJournal, total: int) -> StepResult:
        """The step's result from the journal of its calls on `total` workers."""
        ...
