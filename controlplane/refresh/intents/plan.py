"""Planning a policy refresh: a fresh discovery of the scope, then the plan of every worker.

`plan_policy_refresh` writes a `planned` refresh (or refuses with the blockers); nothing on the
fleet changes until it is started (`lifecycle.start_policy_refresh`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor
from controlplane.bulk import insert_objects
from controlplane.dynamo.fingerprint import FingerprintJson
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet import discovery
from controlplane.fleet.declared_scope import DeclaredScope
from controlplane.fleet.models import DiscoveryRun, DiscoveryTrigger, Source, Worker, WorkerState
from controlplane.refresh.compat_record import (
    compat_at_plan,
    normalize_versions,
    world_size_provenance,
)
from controlplane.refresh.handshake import Group
from controlplane.refresh.intents.base import audit_refresh
from controlplane.refresh.models import (
    FlushPolicy,
    PlannedWorker,
    PolicyRefresh,
)
from controlplane.refresh.planning import (
    Scope,
    ScopeRequest,
    WorkerPlan,
    agreement_rule_of,
    group_plan,
    normalize_fingerprint,
    normalize_pause_modes,
    normalize_target,
    normalize_verification,
    plan_level_blockers,
    plan_worker,
    select_scope,
    source_policy,
)
from controlplane.refresh.planning.analysis import analysis_blockers
from controlplane.refresh.planning.scope import membership_of
from controlplane.refresh.planning.verification import Verification
from controlplane.refresh.strategy import Strategy, instance_list, parse_strategy
from controlplane.refresh.targets import PauseModes, Target, check_straddle
from controlplane.textlimits import LABEL_CHARS

__all__ = [
    "PLAN_DISCOVERY_WAIT_SECONDS",
    "fresh_discovery",
    "plan_policy_refresh",
]


def _live_workers(source: Source, namespaces: list[str] | None):
    workers = Worker.objects.filter(source=source).exclude(state=WorkerState.GONE)
    if namespaces:
        workers = workers.filter(namespace__in=namespaces)
    return workers.select_related("static_worker", "source")


#: How long a plan waits for a scheduled discovery run that holds the source.
PLAN_DISCOVERY_WAIT_SECONDS = 15.0


def fresh_discovery(source: Source) -> tuple[DiscoveryRun | None, str]:
    """A fresh discovery run through the fleet app: (run, problem).

    Fresh means observed after this plan was asked for. When another refresh holds the source,
    a run of it that started after we asked serves this plan too, so a burst of plans on one
    source (concurrent webhooks or API calls) shares a few discoveries instead of queueing
    behind each other until the wait runs out.
    """
    asked_at = timezone.now()
    deadline = time.monotonic() + PLAN_DISCOVERY_WAIT_SECONDS
    while True:
        run = discovery.run_discovery(source.pk, trigger=DiscoveryTrigger.PLAN, wait=0.2)
        if run is None:
            run = (
                DiscoveryRun.objects.filter(
                    source=source, started_at__gte=asked_at, finished_at__isnull=False
                )
                .order_by("-started_at")
                .first()
            )
        if run is not None or time.monotonic() >= deadline:
            break
    if run is None:
        return None, "no fresh discovery: the source is disabled or another refresh holds it"
    if not run.ok:
        return run, f"discovery failed: {run.error or 'listener unreachable'}"
    return run, ""


@dataclass(frozen=True)
class PlanRequest:
    """A plan's inputs once validated: what every worker is asked, and of which scope."""

    target: Target
    pause_mode: str
    pause_modes: PauseModes
    flush_policy: str
    verification: Verification
    fingerprint: FingerprintJson | None
    versions: dict[str, str]
    strategy: Strategy
    instance_ids: list[str] | None
    namespaces: list[str] | None
    #: The plan declares that requests in flight may continue on the new weights (a pause
    #: mode that keeps them is refused without it).
    inflight_may_straddle: bool = False


def validated_request(
    source: Source,
    *,
    target: dict[str, Any],
    namespaces: list[str] | None,
    pause_mode: str,
    verification: dict[str, Any] | None,
    flush_policy: str,
    fingerprint: dict[str, Any] | None,
    pause_modes: dict[str, str] | None,
    versions: dict[str, str] | None,
    strategy: Mapping[str, Any] | None,
    instances: list[str] | None,
    inflight_may_straddle: bool = False,
) -> PlanRequest:
    """Bad input raises ValidationError here, before the discovery runs or anything is written."""
    parsed = parse_strategy(source.default_strategy if strategy is None else strategy)
    instance_ids = instance_list(instances)
    clean_target = normalize_target(target)
    clean_verification = normalize_verification(verification)
    clean_verification["agreement"] = agreement_rule_of(source).to_dict()
    clean_fingerprint = normalize_fingerprint(fingerprint)
    if clean_fingerprint and not clean_verification["generation"]:
        raise ValidationError("a fingerprint needs the generation check, which is turned off")
    clean_modes = normalize_pause_modes(pause_mode, pause_modes)
    check_straddle(pause_mode, clean_modes, clean_target["method"], bool(inflight_may_straddle))
    try:
        clean_versions = normalize_versions(versions)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None
    if flush_policy not in FlushPolicy.values:
        raise ValidationError(f"unknown flush policy {flush_policy!r}")
    return PlanRequest(
        target=clean_target,
        pause_mode=pause_mode,
        pause_modes=clean_modes,
        flush_policy=flush_policy,
        verification=clean_verification,
        fingerprint=clean_fingerprint,
        versions=clean_versions,
        strategy=parsed,
        instance_ids=instance_ids,
        namespaces=sorted(set(namespaces)) if namespaces else None,
        inflight_may_straddle=bool(inflight_may_straddle),
    )


def plan_policy_refresh(
    *,
    source: Source,
    actor: Actor,
    target: dict[str, Any],
    namespaces: list[str] | None = None,
    worker_ids: list[int] | None = None,
    pause_mode: str = "auto",
    verification: dict[str, Any] | None = None,
    rollback_of: PolicyRefresh | None = None,
    flush_policy: str = "auto",
    fingerprint: dict[str, Any] | None = None,
    pause_modes: dict[str, str] | None = None,
    versions: dict[str, str] | None = None,
    strategy: Mapping[str, Any] | None = None,
    instances: list[str] | None = None,
    inflight_may_straddle: bool = False,
) -> PolicyRefresh:
    """Run a fresh discovery and store the plan; blockers are stored, never raised.

    `fingerprint` is the trainer's optional statement of what the new policy generates
    (`dynamo.fingerprint.Fingerprint`); bad input raises ValidationError before anything runs.
    `strategy` is the JSON form of a `refresh.strategy.Strategy` (None: the source's default
    strategy). `instances` refreshes only those instance ids of the scope: the others keep
    serving and stay in the gate's verified set (the refresh runs staged, the gate is not
    closed; see `executor.waves.finish_instances`). `inflight_may_straddle` declares that
    requests in flight may continue on the new weights: a pause mode that keeps them
    (`targets.KEEPING_MODES`) is refused without it.

    The plan's blockers come in a fixed order: the discovery's, then the scope passes'
    (`planning.SCOPE_PASSES`), the plan-wide ones, the group's, and a count of the workers
    whose own passes (`planning.WORKER_PASSES`) found blockers.
    """
    request = validated_request(
        source,
        target=target,
        namespaces=namespaces,
        pause_mode=pause_mode,
        verification=verification,
        flush_policy=flush_policy,
        fingerprint=fingerprint,
        pause_modes=pause_modes,
        versions=versions,
        strategy=strategy,
        instances=instances,
        inflight_may_straddle=inflight_may_straddle,
    )
    last_view = frozenset(membership_of(_live_workers(source, request.namespaces)))
    run, problem = fresh_discovery(source)  # network I/O: outside any transaction
    blockers: list[str] = [problem] if problem else []

    workers = list(_live_workers(source, request.namespaces))
    scope = select_scope(
        ScopeRequest(
            workers=workers,
            last_view=last_view,
            strategy=request.strategy,
            method=request.target["method"],
            worker_ids=worker_ids,
            instance_ids=request.instance_ids,
            rejected=tuple(run.rejected_entries or ()) if run is not None and run.ok else (),
            declared=DeclaredScope.of(source),
            named=request.namespaces,
        )
    )
    blockers += scope.blockers
    policy = source_policy(source)
    blockers += plan_level_blockers(source, verification=request.verification, policy=policy)
    blockers += analysis_blockers(
        source,
        request.strategy,
        scope.selected,
        scope.wave_of,
        request.target["weight_version"],
    )
    group = group_plan(request.target, scope.selected)
    blockers += group.pop("blockers", [])
    plans = _worker_plans(request, scope, group, policy)
    blocked = sum(1 for p in plans if p.blockers)
    if blocked:
        blockers.append(f"{blocked} of {len(plans)} workers have blockers")
    return _store_plan(
        source,
        actor,
        request,
        namespaces=request.namespaces or sorted({w.namespace for w in workers}),
        membership=membership_of(workers),
        scope=scope,
        group=group,
        plans=plans,
        blockers=blockers,
        run=run,
        rollback_of=rollback_of,
    )


def _worker_plans(
    request: PlanRequest, scope: Scope, group: Group, policy: OutboundPolicy | None
) -> list[WorkerPlan]:
    ranks = group.get("ranks", {})
    return [
        plan_worker(
            w,
            target=request.target,
            pause_mode=request.pause_mode,
            pause_modes=request.pause_modes,
            flush_policy=request.flush_policy,
            verification=request.verification,
            # Allowed networks that do not parse (a plan-wide blocker) allow no network.
            policy=policy or OutboundPolicy(()),
            fingerprint=request.fingerprint,
            # Stored as a JSON list: `[first rank, how many]`.
            rank=cast(tuple[int, int], tuple(ranks[w.key])) if w.key in ranks else None,
            group_world_size=group.get("world_size"),
            # A refresh of an external policy waits for the trainer's applied report.
            trainer_applies=True,
        )
        for w in scope.selected
    ]


def _store_plan(
    source: Source,
    actor: Actor,
    request: PlanRequest,
    *,
    namespaces: list[str],
    membership: list[str],
    scope: Scope,
    group: Group,
    plans: list[WorkerPlan],
    blockers: list[str],
    run: DiscoveryRun | None,
    rollback_of: PolicyRefresh | None,
) -> PolicyRefresh:
    """The refresh, its planned workers and the audit row, in one transaction.

    Durable: the plan follows a discovery over the network, so it must be the caller's own
    transaction, never part of an outer one that would hold its locks across that I/O."""
    with transaction.atomic(durable=True):
        refresh = PolicyRefresh.objects.create(
            source=source,
            namespaces=namespaces,
            worker_keys=scope.subset_keys,
            target=request.target,
            pause_mode=request.pause_mode,
            pause_modes=request.pause_modes,
            inflight_may_straddle=request.inflight_may_straddle,
            flush_policy=request.flush_policy,
            verification=request.verification,
            fingerprint=request.fingerprint,
            group=group,
            compat=compat_at_plan(
                source, request.target, request.verification, plans, group, run, request.versions
            ),
            plan_blockers=blockers,
            plan_membership=membership,
            discovery_run=run,
            requested_by=actor.user,
            requested_by_label=actor.label[:LABEL_CHARS],
            rollback_of=rollback_of,
            strategy=request.strategy.to_dict(),
            instances=request.instance_ids,
            waves=max(scope.wave_count, 1),
        )
        # One COPY of plain values (`bulk.insert_objects`): no caller needs the rows' ids,
        # and `bulk_create` cost ~0.3 s of a 500-worker plan.
        insert_objects(
            PlannedWorker,
            [
                PlannedWorker(
                    refresh=refresh,
                    worker=p.worker,
                    key=p.worker.key,
                    namespace=p.worker.namespace,
                    instance_id=p.worker.instance_id,
                    system_url=p.worker.system_url,
                    family=p.family,
                    model=p.worker.model,
                    calls=p.calls,
                    blockers=p.blockers,
                    flush_skipped=p.flush_skipped,
                    update_method=p.update_method,
                    method_reason=p.method_reason,
                    pause_mode=p.pause_mode,
                    rank_offset=p.rank_offset,
                    ranks=p.ranks,
                    world_size=p.worker.world_size,
                    world_size_from=world_size_provenance(p.worker, p.family),
                    wave=scope.wave_of.get(p.worker.key, 1),
                )
                for p in plans
            ],
        )
        audit_refresh(
            AuditAction.POLICY_REFRESH_PLANNED,
            refresh,
            actor,
            source=source.name,
            namespaces=namespaces,
            target=request.target,
            workers=len(plans),
            blockers=blockers,
            rollback_of=rollback_of.pk if rollback_of else None,
            agreement=request.verification["agreement"],
            fingerprint=request.fingerprint,
            pause_modes=request.pause_modes,
            inflight_may_straddle=request.inflight_may_straddle,
            world_size=group.get("world_size"),
            strategy=request.strategy.to_dict(),
            waves=scope.wave_count,
            instances=request.instance_ids,
        )
    return refresh
