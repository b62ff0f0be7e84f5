"""The canary's evaluation gate: a verdict on the canary's verified instances, then go on or
roll the canary back.

After the canary wave passed verify (the generation check, the trainer's fingerprint when one
was given, cross-worker agreement), a canary whose strategy asks for a verdict waits in
`canary_review`: the `refresh.canary_review` notification carries its verified instance set
(`progress.canary.instances`) and deadline. Then:

- `record_canary_verdict(refresh, passed=..., metrics=..., actor=...)` records the trainer's
  answer (the verdict webhook and `POST …/canary_verdict` call it). Only a canary whose
  strategy says `evaluation: trainer` takes one: a `manual` canary is judged by a person (the
  refresh page's approve/reject buttons and the CLI, `approve_canary`/`reject_canary`), and a
  `none` canary is judged by the checks alone and never waits for a verdict; a trainer's
  verdict on either is refused (`TrainerVerdictRefused`, audited) and changes nothing.
  Idempotent: the same verdict again returns the refresh unchanged; a different one after the
  first is refused.
- Passed: the refresh goes on with wave 2 (or waits at a pause point after the canary).
- Failed, or no verdict before the deadline (`expire_canary_reviews`, a beat task): the canary
  workers are rolled back to the gate's old policy (`executor/canary.py`), then it holds.

Everything here is audited and refused (`InvalidTransition`) in any other state.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane.accounts.roles import Perm
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor
from controlplane.refresh.errors import InvalidTransition, wrong_state
from controlplane.refresh.executor.waves import (
    admit_verified_so_far,
    after_verdict,
    by_namespace,
    verified_in_wave,
)
from controlplane.refresh.intents import base
from controlplane.refresh.intents.base import audit_refresh, locked_refresh
from controlplane.refresh.live import publish_state_on_commit
from controlplane.refresh.models import PolicyRefresh, RefreshState
from controlplane.refresh.progress import (
    CANARY_ANALYSING,
    CANARY_AWAITING,
    CANARY_FAILED,
    CANARY_PASSED,
    CanaryReview,
    canary_deadline,
    canary_of,
    with_canary_verdict,
)
from controlplane.refresh.strategy import EVAL_MANUAL, EVAL_NONE, EVAL_TRAINER, stored
from controlplane.textlimits import LABEL_CHARS, STATE_REASON_CHARS

#: The most metrics a verdict may carry (their JSON text), so a verdict stays a small record.
MAX_METRICS_BYTES = 16_384
SYSTEM = Actor.system("canary review")


def _check_metrics(metrics: Any) -> dict[str, Any]:
    if metrics is None:
        return {}
    if not isinstance(metrics, dict):
        raise ValidationError("metrics: expected an object")
    try:
        text = json.dumps(metrics, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"metrics: not JSON ({exc})") from None
    if len(text) > MAX_METRICS_BYTES:
        raise ValidationError(f"metrics: larger than {MAX_METRICS_BYTES} bytes")
    return metrics


def same_version(given: Any, planned: Any) -> bool:
    """A trainer may send a version as a number or as text (`7` for `"7"`)."""
    return given == planned or str(given) == str(planned)


class TrainerVerdictRefused(InvalidTransition):
    """A trainer's verdict on a canary whose strategy does not ask the trainer (409)."""

    code = "canary_not_trainer_judged"


#: Why a canary with each non-trainer evaluation takes no trainer verdict.
_NOT_THE_TRAINERS = {
    EVAL_MANUAL: "is judged by a person (evaluation manual): approve or reject it on the "
    "refresh page or with `manage.py refresh approve-canary|reject-canary`",
    EVAL_NONE: "is judged by the generation and fingerprint checks alone (evaluation none) "
    "and never waits for a verdict",
}


def record_canary_verdict(
    refresh: PolicyRefresh,
    *,
    passed: bool,
    metrics: dict[str, Any] | None = None,
    actor: Actor,
    reason: str = "",
    enqueue: bool = True,
    weight_version: Any = None,
) -> PolicyRefresh:
    """Record the trainer's verdict on a canary waiting in `canary_review`; go on or roll it
    back. Refused (`TrainerVerdictRefused`, audited, nothing changes) unless the canary's
    strategy says `evaluation: trainer`.

    `metrics` is what the evaluator measured (kept on the refresh and in the audit event).
    `weight_version`, when given (the trainer's surfaces always give it), must be the version
    the refresh loads: a verdict on another checkpoint is refused, never applied to this one.
    The caller has checked the actor may judge this refresh (a trainer token scoped to the
    source, or a person with `operate_refresh`); a user actor is checked here too. `enqueue`
    False leaves execution to the caller (tests, the management command).
    """
    return _record(
        refresh,
        passed=passed,
        metrics=metrics,
        actor=actor,
        reason=reason,
        enqueue=enqueue,
        weight_version=weight_version,
        by_trainer=True,
    )


def _record(
    refresh: PolicyRefresh,
    *,
    passed: bool,
    metrics: dict[str, Any] | None,
    actor: Actor,
    reason: str,
    enqueue: bool,
    weight_version: Any,
    by_trainer: bool,
) -> PolicyRefresh:
    """A verdict from the trainer (`by_trainer`) or from a person (approve/reject)."""
    if actor.user is not None and not actor.user.has_perm(Perm.OPERATE_REFRESH.value):
        raise PermissionDenied(f"{actor.label} may not judge a canary")
    metrics = _check_metrics(metrics)
    reason = (reason or "").strip()
    with transaction.atomic():
        refresh = locked_refresh(refresh)
        refused = _why_not_the_trainers(refresh) if by_trainer else ""
        if not refused:
            if not _needs_deciding(refresh, passed=passed, weight_version=weight_version):
                return refresh  # the same answer again (a retried webhook): nothing to do
            decide_locked(refresh, passed=passed, metrics=metrics, actor=actor, reason=reason)
            if enqueue:
                base.enqueue_execution(refresh.pk)
    # Audited after the refusal's own transaction ended, so raising does not roll it back.
    if refused:
        audit_refresh(
            AuditAction.POLICY_REFRESH_CANARY_VERDICT_REFUSED,
            refresh,
            actor,
            passed=passed,
            weight_version=weight_version,
            reason=refused,
        )
        raise TrainerVerdictRefused(refused)
    publish_state_on_commit(refresh)
    return refresh


def _needs_deciding(refresh: PolicyRefresh, *, passed: bool, weight_version: Any) -> bool:
    """False for the same verdict again; raises when no canary waits or for another version."""
    canary = canary_of(refresh) or CanaryReview()
    if weight_version is not None and not same_version(weight_version, refresh.weight_version):
        raise InvalidTransition(
            f"policy refresh #{refresh.pk} is to {refresh.weight_version!r}, "
            f"not {weight_version!r}: the verdict is about another checkpoint"
        )
    if canary.get("verdict") == (CANARY_PASSED if passed else CANARY_FAILED):
        return False
    if canary.get("state") == CANARY_ANALYSING:
        raise InvalidTransition(
            f"policy refresh #{refresh.pk}'s canary is still being analysed; a verdict is "
            "taken once the analysis has concluded"
        )
    if refresh.state != RefreshState.CANARY_REVIEW or canary.get("state") != CANARY_AWAITING:
        raise wrong_state(
            refresh,
            why="a canary verdict is taken only while its canary waits for one",
        )
    return True


def _why_not_the_trainers(refresh: PolicyRefresh) -> str:
    """Empty when the refresh's canary takes a trainer's verdict, else why it does not."""
    strategy = stored(refresh)
    if (canary_of(refresh) or {}).get("needs_person"):
        return (
            f"policy refresh #{refresh.pk}'s canary analysis was not a clear pass: a person "
            "decides with the report in front of them; a trainer's verdict is refused"
        )
    if strategy.canary is None or strategy.canary.evaluation == EVAL_TRAINER:
        return ""  # no canary at all: the state check says nothing waits for a verdict
    why = _NOT_THE_TRAINERS.get(strategy.canary.evaluation, "is not judged by the trainer")
    return f"policy refresh #{refresh.pk}'s canary {why}; a trainer's verdict is refused"


def decide_locked(
    refresh: PolicyRefresh, *, passed: bool, metrics: dict, actor: Actor, reason: str
) -> None:
    """Move a locked refresh out of `canary_review` (the caller holds its row)."""
    progress = with_canary_verdict(
        refresh, passed=passed, metrics=metrics, by=actor.label[:LABEL_CHARS], reason=reason
    )
    if passed:
        canary_set = by_namespace(verified_in_wave(refresh))
        state, fields, what = after_verdict(refresh, progress, "canary")
        refresh.transition(state, **fields)
        # Lock order: gates before the audit chain head.
        admit_verified_so_far(refresh, canary_set, f"canary passed ({actor.label}); {what}")
        audit_refresh(
            AuditAction.POLICY_REFRESH_CANARY_PASSED, refresh, actor, metrics=metrics, next=what
        )
    else:
        held = f"canary rejected by {actor.label}" + (f": {reason}" if reason else "")
        refresh.transition(
            RefreshState.CANARY_ROLLBACK, progress=progress, held_reason=held[:STATE_REASON_CHARS]
        )
        audit_refresh(
            AuditAction.POLICY_REFRESH_CANARY_FAILED, refresh, actor, metrics=metrics, reason=held
        )


def approve_canary(refresh: PolicyRefresh, *, actor: Actor, reason: str = "") -> PolicyRefresh:
    """A person passes a canary whose strategy asked for manual approval."""
    _require_manual(refresh)
    return _by_person(refresh, passed=True, actor=actor, reason=reason)


def reject_canary(refresh: PolicyRefresh, *, actor: Actor, reason: str) -> PolicyRefresh:
    """A person fails the canary: its workers are rolled back, then the refresh holds."""
    if not reason or not reason.strip():
        raise ValidationError("rejecting a canary needs a reason")
    return _by_person(refresh, passed=False, actor=actor, reason=reason)


def _by_person(refresh: PolicyRefresh, *, passed: bool, actor: Actor, reason: str):
    return _record(
        refresh,
        passed=passed,
        metrics=None,
        actor=actor,
        reason=reason,
        enqueue=True,
        weight_version=None,
        by_trainer=False,
    )


def _require_manual(refresh: PolicyRefresh) -> None:
    strategy = stored(refresh)
    if (canary_of(refresh) or {}).get("needs_person"):
        return  # a marginal or inconclusive analysis: a person decides, whatever `evaluation`
    if strategy.canary is None or strategy.canary.evaluation != EVAL_MANUAL:
        raise InvalidTransition(
            f"policy refresh #{refresh.pk} has no canary awaiting a person's approval"
        )


def deadline_of(refresh: PolicyRefresh) -> datetime | None:
    raw = canary_deadline(refresh)
    return datetime.fromisoformat(raw) if raw else None


def expire_canary_reviews(now: datetime | None = None) -> list[int]:
    """Fail every canary whose verdict did not come before its deadline (a beat task): its
    workers are rolled back and the refresh holds, saying nobody answered."""
    now = now or timezone.now()
    expired = []
    for refresh in PolicyRefresh.objects.filter(state=RefreshState.CANARY_REVIEW).order_by("id"):
        deadline = deadline_of(refresh)
        if deadline is None or deadline > now:
            continue
        with transaction.atomic():
            locked = locked_refresh(refresh)
            if locked.state != RefreshState.CANARY_REVIEW:
                continue  # a verdict came meanwhile
            decide_locked(
                locked,
                passed=False,
                metrics={},
                actor=SYSTEM,
                reason=f"no verdict before the deadline {deadline.isoformat()}",
            )
            base.enqueue_execution(locked.pk)
        expired.append(refresh.pk)
    return expired
