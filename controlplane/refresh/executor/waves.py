"""The executor's side of a staged refresh (waves, canary, named instances): which workers the
worker steps call, the gate's instance sets as waves move, and what follows a verified wave.

One refresh runs `pause → update → flush → resume → verify` once per wave: `PolicyRefresh.wave`
names the wave being run and the worker steps call only its workers. The gate is taken without
closing it (`gates.begin_staged`); before a wave is paused its instances leave the verified set
(`gates.stage_wave`); once verified they join the new version's set (`gates.wave_verified`).
After a verified wave the refresh runs the next one, waits for a canary verdict
(`canary_review`), or waits at a pause point (`waiting`); after the last, `reopen` opens the
gate at the new version for every verified worker, naming the ones the failure budget left out.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from controlplane import jobs
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import record
from controlplane.notify.emit import notify
from controlplane.refresh import gates
from controlplane.refresh.departed import departed_ids, left_out_ids
from controlplane.refresh.models import (
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
    WorkerStepResult,
    state_change,
)
from controlplane.refresh.progress import (
    CANARY_ANALYSING,
    CANARY_AWAITING,
    CANARY_PASSED,
    CanaryAnalysisRef,
    CanaryReview,
    Progress,
    canary_of,
    pause_is_requested,
    progress_of,
    waiting_after,
    with_canary,
    with_previous_policy,
)
from controlplane.refresh.step_order import StepName
from controlplane.refresh.strategy import CANARY, EVAL_NONE, Strategy, stored, wave_label

#: The Celery task that runs a canary's analysis (`refresh.tasks`; sent by name).
ANALYSE_CANARY_TASK = "refresh.analyse_canary"


def is_staged(refresh: PolicyRefresh) -> bool:
    """The gate keeps serving the old set while this refresh runs (waves, canary, instances)."""
    return stored(refresh).staged or refresh.instances is not None


def is_canary_wave(refresh: PolicyRefresh) -> bool:
    return stored(refresh).kind == CANARY and refresh.wave == 1


def in_wave(refresh: PolicyRefresh, workers) -> list[PlannedWorker]:
    return [w for w in workers if w.wave == refresh.wave]


def by_namespace(workers) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for w in workers:
        out.setdefault(w.namespace, []).append(w.instance_id)
    return out


def staged_reason(refresh: PolicyRefresh, strategy: Strategy | None = None) -> str:
    strategy = strategy or stored(refresh)
    label = wave_label(strategy, refresh.wave)
    return (
        f"policy refresh #{refresh.pk} to {refresh.weight_version!r} in progress "
        f"({label} of {refresh.waves}): instance_sets lists which instances serve which version"
    )


def begin(lease, refresh: PolicyRefresh, actor) -> str:
    """The gate step of a staged refresh: remember the gate's policy (what a failed canary goes
    back to), then take the gates without closing them. Inside the caller's transaction."""
    policy = (
        gates.Gate.objects.filter(
            source=refresh.source, namespace__in=refresh.namespaces, verified_policy__isnull=False
        )
        .order_by("-updated_at")
        .values_list("verified_policy", flat=True)
        .first()
    )
    progress = with_previous_policy(refresh, policy)
    lease.guard(progress=progress)
    refresh.progress = progress
    gates.begin_staged(refresh, actor=actor, reason=staged_reason(refresh), waves=refresh.waves)
    return f"staged {', '.join(refresh.namespaces)}: the gate keeps admitting the old set"


def stage(refresh: PolicyRefresh, workers: list[PlannedWorker]) -> None:
    """Before pausing `workers` of the current wave: they leave the old verified set."""
    if workers:
        gates.stage_wave(
            refresh, refresh.wave, by_namespace(workers), reason=staged_reason(refresh)
        )


def verified_in_wave(refresh: PolicyRefresh) -> list[PlannedWorker]:
    """The current wave's workers whose latest verify passed (departed and left out are not)."""
    latest: dict[int, str] = dict(
        WorkerStepResult.objects.filter(refresh=refresh, step=StepName.VERIFY)
        .order_by("id")
        .values_list("planned_worker_id", "status")
    )
    out = departed_ids(refresh.pk) | left_out_ids(refresh.pk)
    return [
        w
        for w in in_wave(refresh, refresh.workers.all())
        if w.pk not in out and latest.get(w.pk) in ("ok", "skipped")
    ]


def next_move(refresh: PolicyRefresh) -> tuple[str, dict[str, Any], str]:
    """After wave `refresh.wave` verified: (state, fields, what happened) — the next wave's
    pause, a canary verdict to wait for, or a pause point."""
    strategy = stored(refresh)
    progress = progress_of(refresh)
    wave = refresh.wave
    label = wave_label(strategy, wave)
    if strategy.kind == CANARY and wave == 1:
        assert strategy.canary is not None
        if strategy.canary.analysis:
            # The analysis judges first (a Celery task, `intents/analysis.py`); its outcome
            # then asks for `evaluation`'s verdict, a person's, or rolls the canary back. The
            # deadline covers the analysis too: a lost analysis fails the canary, never
            # leaves it waiting forever.
            deadline = timezone.now() + timedelta(seconds=strategy.canary.timeout_seconds)
            with_canary(
                progress,
                CanaryReview(
                    state=CANARY_ANALYSING,
                    evaluation=strategy.canary.evaluation,
                    deadline=deadline.isoformat(),
                    instances=by_namespace(verified_in_wave(refresh)),
                    analysis=CanaryAnalysisRef(template=strategy.canary.analysis),
                ),
            )
            return (
                RefreshState.CANARY_REVIEW,
                {"progress": progress},
                f"canary verified; analysing it against the baseline with template "
                f"{strategy.canary.analysis!r} until {deadline.isoformat()}",
            )
        if strategy.canary.evaluation != EVAL_NONE:
            deadline = timezone.now() + timedelta(seconds=strategy.canary.timeout_seconds)
            with_canary(
                progress,
                CanaryReview(
                    state=CANARY_AWAITING,
                    evaluation=strategy.canary.evaluation,
                    deadline=deadline.isoformat(),
                    instances=by_namespace(verified_in_wave(refresh)),
                ),
            )
            return (
                RefreshState.CANARY_REVIEW,
                {"progress": progress},
                f"canary verified; waiting for a {strategy.canary.evaluation} verdict until "
                f"{deadline.isoformat()}",
            )
        with_canary(
            progress,
            CanaryReview(
                state=CANARY_PASSED,
                by="the fingerprint and generation checks",
                at=timezone.now().isoformat(),
            ),
        )
    return after_verdict(refresh, progress, label)


def after_verdict(
    refresh: PolicyRefresh, progress: Progress, label: str
) -> tuple[str, dict[str, Any], str]:
    """Go on after wave `refresh.wave`: wait at a pause point, or pause the next wave."""
    strategy = stored(refresh)
    wave = refresh.wave
    if wave in strategy.pause_after or pause_is_requested(progress):
        return (
            RefreshState.WAITING,
            {"progress": waiting_after(progress, wave)},
            f"{label} verified; waiting until continued",
        )
    return (
        RefreshState.PAUSING,
        {"progress": progress, "wave": wave + 1},
        f"{label} verified; wave {wave + 1} of {refresh.waves} next",
    )


def finish_wave(lease, refresh: PolicyRefresh, actor) -> str:
    """Record the verified wave on the gate and move on (inside the caller's transaction,
    after its lease guard). Returns the new state."""
    strategy = stored(refresh)
    # Read under the lease's row lock: a pause asked for during this wave is not lost.
    refresh.progress = PolicyRefresh.objects.values_list("progress", flat=True).get(pk=refresh.pk)
    state, fields, what = next_move(refresh)
    verified = verified_in_wave(refresh)
    awaiting = state == RefreshState.CANARY_REVIEW
    if state in (RefreshState.CANARY_REVIEW, RefreshState.WAITING):
        # Nobody runs while it waits: the lease goes, and the reconciler leaves it alone.
        lease.release(**state_change(state, **fields))
    else:
        lease.guard(**state_change(state, **fields))
    refresh.progress = fields["progress"]
    gates.wave_verified(
        refresh,
        by_namespace(verified),
        admit=strategy.admit_as_verified and not awaiting,
        reason=what,
    )
    record(
        AuditAction.POLICY_REFRESH_WAVE_VERIFIED,
        actor=actor,
        target=refresh,
        details={
            "wave": refresh.wave,
            "waves": refresh.waves,
            "label": wave_label(strategy, refresh.wave),
            "verified": len(verified),
            "next": what,
        },
        correlation_id=refresh.correlation_id,
    )
    analysing = awaiting and (canary_of(refresh) or {}).get("state") == CANARY_ANALYSING
    if awaiting:
        record(
            AuditAction.POLICY_REFRESH_CANARY_REVIEW,
            actor=actor,
            target=refresh,
            details={"canary": canary_of(refresh)},
            correlation_id=refresh.correlation_id,
        )
    if analysing:
        # The verdict is asked for (notified) once the analysis concluded.
        jobs.enqueue(ANALYSE_CANARY_TASK, refresh.pk)
    elif awaiting:
        notify("refresh.canary_review", refresh=refresh, reason=what)
    elif state == RefreshState.WAITING:
        record(
            AuditAction.POLICY_REFRESH_WAITING,
            actor=actor,
            target=refresh,
            details={"after_wave": refresh.wave, "waves": refresh.waves},
            correlation_id=refresh.correlation_id,
        )
        notify("refresh.waiting", refresh=refresh, reason=what)
    return state


def admit_verified_so_far(
    refresh: PolicyRefresh, canary: dict[str, list[str]], reason: str
) -> None:
    """After a canary verdict: with `admit_as_verified` the canary joins the new version's
    gate; either way the gate's reason says what comes next."""
    gates.wave_verified(refresh, canary, admit=stored(refresh).admit_as_verified, reason=reason)
