"""The operator actions as one table: name → permission → action function → success message.

The refresh pages, the JSON API and the gate API run an action through its row, so each
action's permission, inputs and wording are written once. A row only adapts the call: the
action function (`refresh.intents`) checks the state, writes, audits and publishes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controlplane.accounts.roles import Perm
from controlplane.audit.recorder import Actor
from controlplane.refresh import handshake, quarantine
from controlplane.refresh.intents import canary, external, lifecycle, pausepoints, recovery
from controlplane.refresh.models import Gate, PolicyRefresh, Quarantine


@dataclass(frozen=True)
class ActionInput:
    """What a person may give with an action (a form or a JSON body); each action reads its own."""

    reason: str = ""
    resume_engines: bool = False
    #: The namespace a per-namespace action acts on (force-reopen from a refresh).
    namespace: str = ""
    #: The version a trainer says it broadcast (`broadcast_done`) or judged (`canary_verdict`);
    #: checked when given.
    weight_version: str | int | None = None
    #: The handshake attempt a `broadcast_done` is about (`group.attempt`); checked when given.
    attempt: int | None = None
    #: A canary verdict (`canary_verdict`): passed or not, and what the evaluation measured.
    passed: bool = False
    metrics: dict[str, Any] | None = None
    #: The instances an `applied` report is about (None: every worker announced).
    instance_ids: list[str] | None = None


@dataclass(frozen=True)
class Action[T: (PolicyRefresh, Gate, Quarantine)]:
    """One row: `run(target, actor, given)` returns the object to show next (a rollback
    answers with the new refresh); `success` may name it as `{target}`."""

    name: str
    perm: Perm
    run: Callable[[T, Actor, ActionInput], T]
    success: str

    def message(self, result: T) -> str:
        return self.success.format(target=result)


START = Action[PolicyRefresh](
    "start",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: lifecycle.start_policy_refresh(refresh, actor=actor),
    "Policy refresh started.",
)
APPROVE = Action[PolicyRefresh](
    "approve",
    Perm.APPROVE_REFRESH,
    lambda refresh, actor, given: lifecycle.approve_policy_refresh(refresh, actor=actor),
    "Approved; the refresh is running.",
)
REJECT = Action[PolicyRefresh](
    "reject",
    Perm.APPROVE_REFRESH,
    lambda refresh, actor, given: lifecycle.reject_policy_refresh(
        refresh, actor=actor, reason=given.reason
    ),
    "Rejected.",
)
ABORT = Action[PolicyRefresh](
    "abort",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: lifecycle.abort_policy_refresh(
        refresh, actor=actor, resume_engines=given.resume_engines
    ),
    "Abort requested; calls in flight are cancelled and the refresh ends within seconds.",
)
DISCARD = Action[PolicyRefresh](
    "discard",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: lifecycle.discard_policy_refresh(
        refresh, actor=actor, reason=given.reason
    ),
    "Plan discarded; nothing was started.",
)
RETRY = Action[PolicyRefresh](
    "retry",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: lifecycle.retry_policy_refresh(refresh, actor=actor),
    "Retrying the failed step on failed and unreached workers.",
)
ROLLBACK = Action[PolicyRefresh](
    "rollback",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: recovery.rollback_policy_refresh(refresh, actor=actor),
    "Rolling back to the last verified policy.",
)
END = Action[PolicyRefresh](
    "end",
    Perm.APPROVE_REFRESH,
    lambda refresh, actor, given: lifecycle.end_policy_refresh(
        refresh, actor=actor, reason=given.reason
    ),
    "Ended; the scope is free and its gates stay closed.",
)
RESOLVE_MEMBERSHIP = Action[PolicyRefresh](
    "resolve-membership",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: recovery.resolve_membership(refresh, actor=actor),
    "Membership resolved: leavers dropped, joiners left out of the verified set; "
    "the held step runs again.",
)
REOPEN_VERIFIED = Action[PolicyRefresh](
    "reopen-verified",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: recovery.reopen_verified_namespaces(refresh, actor=actor),
    "Every namespace whose workers all passed verify is open; the others stay closed.",
)
FORCE_REOPEN_NAMESPACE = Action[PolicyRefresh](
    "force-reopen",
    Perm.FORCE_REOPEN,
    lambda refresh, actor, given: recovery.force_reopen_namespace(
        refresh, given.namespace, actor=actor, reason=given.reason
    ),
    "Gate force-reopened for that namespace; the refresh goes on for the others.",
)
BROADCAST_DONE = Action[PolicyRefresh](
    "broadcast_done",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: handshake.report_broadcast_done(
        refresh, actor=actor, weight_version=given.weight_version, attempt=given.attempt
    ),
    "Broadcast recorded; the workers apply the new weights.",
)
APPLIED = Action[PolicyRefresh](
    "applied",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: external.report_applied(
        refresh,
        actor=actor,
        weight_version=given.weight_version,
        instance_ids=given.instance_ids,
    ),
    "Applied report recorded.",
)
PAUSE_AT_NEXT_WAVE = Action[PolicyRefresh](
    "pause",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: pausepoints.request_pause(refresh, actor=actor),
    "The refresh waits after the wave in progress until continued.",
)
CONTINUE = Action[PolicyRefresh](
    "continue",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: pausepoints.continue_refresh(refresh, actor=actor),
    "Continued; the next wave is starting.",
)
APPROVE_CANARY = Action[PolicyRefresh](
    "approve-canary",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: canary.approve_canary(refresh, actor=actor, reason=given.reason),
    "Canary approved; the rest of the scope follows.",
)
REJECT_CANARY = Action[PolicyRefresh](
    "reject-canary",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: canary.reject_canary(refresh, actor=actor, reason=given.reason),
    "Canary rejected; its workers go back to the old policy, then the refresh holds.",
)
CANARY_VERDICT = Action[PolicyRefresh](
    "canary_verdict",
    Perm.OPERATE_REFRESH,
    lambda refresh, actor, given: canary.record_canary_verdict(
        refresh,
        passed=given.passed,
        metrics=given.metrics,
        reason=given.reason,
        weight_version=given.weight_version,
        actor=actor,
    ),
    "Canary verdict recorded.",
)
FORCE_REOPEN = Action[Gate](
    "force-reopen",
    Perm.FORCE_REOPEN,
    lambda gate, actor, given: recovery.force_reopen_gate(gate, actor=actor, reason=given.reason),
    "Gate {target.namespace} force-reopened.",
)

#: The actions on one refresh, by the name their URLs use.
REFRESH_ACTIONS: dict[str, Action[PolicyRefresh]] = {
    action.name: action
    for action in (
        START,
        APPROVE,
        REJECT,
        ABORT,
        DISCARD,
        RETRY,
        ROLLBACK,
        END,
        RESOLVE_MEMBERSHIP,
        REOPEN_VERIFIED,
        FORCE_REOPEN_NAMESPACE,
        PAUSE_AT_NEXT_WAVE,
        CONTINUE,
        APPROVE_CANARY,
        REJECT_CANARY,
    )
}


# -- the exits of a quarantined worker (refresh.quarantine): each refuses, changing nothing,
# when the quarantine's state does not allow it (`QuarantineRefused`).

RETRY_QUARANTINE = Action[Quarantine](
    "retry",
    Perm.OPERATE_REFRESH,
    lambda q, actor, given: quarantine.retry(q, actor=actor),
    "Catch-up of {target.key} queued again.",
)
RELEASE_QUARANTINE = Action[Quarantine](
    "release",
    Perm.OPERATE_REFRESH,
    lambda q, actor, given: quarantine.release(q, actor=actor, reason=given.reason),
    "{target.key} resumed without being admitted: it serves outside the verified set.",
)
DROP_QUARANTINE = Action[Quarantine](
    "drop",
    Perm.OPERATE_REFRESH,
    lambda q, actor, given: quarantine.drop(q, actor=actor),
    "Quarantine of {target.key} dropped.",
)

#: The exits of one quarantine, by the name their URLs and the CLI use.
QUARANTINE_ACTIONS: dict[str, Action[Quarantine]] = {
    action.name: action for action in (RETRY_QUARANTINE, RELEASE_QUARANTINE, DROP_QUARANTINE)
}
