"""Planning a policy refresh: a fresh discovery of the scope, then the plan of every worker.

`plan_policy_refresh` writes a `planned` refresh (or refuses with the blockers); nothing on the
fleet changes until it is started (`lifecycle.start_policy_refresh`).
"""

from __future__ import annotations

import time
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet import discovery
from controlplane.fleet.models import DiscoveryRun, DiscoveryTrigger, Source, Worker, WorkerState
from controlplane.refresh.compat_record import compat_at_plan, normalize_versions
from controlplane.refresh.intents.base import audit_refresh
from controlplane.refresh.models import (
    FlushPolicy,
    PlannedWorker,
    PolicyRefresh,
)
from controlplane.refresh.planning import (
    agreement_rule_of,
    group_plan,
    normalize_fingerprint,
    normalize_pause_modes,
    normalize_target,
    normalize_verification,
    plan_level_blockers,
    plan_worker,
    source_policy,
)
from controlplane.refresh.strategy import (
    Placed,
    assign_waves,
    instance_list,
    parse_strategy,
)

__all__ = [
    "PLAN_DISCOVERY_WAIT_SECONDS",
    "fresh_discovery",
    "plan_policy_refresh",
]


def _live_workers(source: Source, namespaces: list[str] | None):
    workers = Worker.objects.filter(source=source).exclude(state=WorkerState.GONE)
    if namespaces:
        workers = workers.filter(namespace__in=namespaces)
    return workers.select_related("static_worker")


def _membership(workers) -> list[str]:
    return sorted(w.key for w in workers if w.static_worker_id is None)


#: How long a plan waits for a scheduled discovery refresh that holds the source.
PLAN_DISCOVERY_WAIT_SECONDS = 15.0


def fresh_discovery(source: Source) -> tuple[DiscoveryRun | None, str]:
    """A fresh discovery refresh through the fleet app: (run, problem).

    Fresh means observed after this plan was asked for. When another refresh holds the source,
    a run of it that started after we asked serves this plan too, so a burst of plans on one
    source (concurrent webhooks or API calls) shares a few discoveries instead of queueing
    behind each other until the wait runs out.
    """
    asked_at = timezone.now()
    deadline = time.monotonic() + PLAN_DISCOVERY_WAIT_SECONDS
    while True:
        run = discovery.refresh_source(source.pk, trigger=DiscoveryTrigger.PLAN, wait=0.2)
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
    strategy: dict[str, Any] | None = None,
    instances: list[str] | None = None,
) -> PolicyRefresh:
    """Run a fresh discovery and store the plan; blockers are stored, never raised.

    `fingerprint` is the trainer's optional statement of what the new policy generates
    (`dynamo.fingerprint.Fingerprint`); bad input raises ValidationError before anything runs.
    `strategy` is the JSON form of a `refresh.strategy.Strategy` (None: the source's default
    strategy). `instances` refreshes only those instance ids of the scope: the others keep
    serving and stay in the gate's verified set (the refresh runs staged, the gate is not
    closed; see `executor.waves.finish_instances`).
    """
    parsed = parse_strategy(source.default_strategy if strategy is None else strategy)
    instance_ids = instance_list(instances)
    target = normalize_target(target)
    verification = normalize_verification(verification)
    verification["agreement"] = agreement_rule_of(source).to_dict()
    fingerprint = normalize_fingerprint(fingerprint)
    if fingerprint and not verification["generation"]:
        raise ValidationError("a fingerprint needs the generation check, which is turned off")
    pause_modes = normalize_pause_modes(pause_mode, pause_modes)
    try:
        versions = normalize_versions(versions)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None
    if flush_policy not in FlushPolicy.values:
        raise ValidationError(f"unknown flush policy {flush_policy!r}")
    namespaces = sorted(set(namespaces)) if namespaces else None

    last_view = set(_membership(_live_workers(source, namespaces)))
    run, problem = fresh_discovery(source)  # network I/O: outside any transaction
    blockers: list[str] = [problem] if problem else []

    workers = list(_live_workers(source, namespaces))
    membership = _membership(workers)
    if namespaces is None:
        namespaces = sorted({w.namespace for w in workers})
    if last_view and set(membership) != last_view:
        joined, left = set(membership) - last_view, last_view - set(membership)
        blockers.append(
            f"membership differs from the last view ({len(joined)} joined, {len(left)} left); "
            "review the fleet and plan again"
        )
    selected = workers
    subset_keys = None
    if worker_ids:
        selected = [w for w in workers if w.pk in set(worker_ids)]
        subset_keys = sorted(w.key for w in selected)
        if len(selected) != len(set(worker_ids)):
            blockers.append("some selected workers are gone or outside the chosen namespaces")
    if instance_ids is not None:
        by_instance = {w.instance_id: w for w in selected}
        missing = [i for i in instance_ids if i not in by_instance]
        if missing:
            blockers.append(
                f"instance(s) {', '.join(missing)} are not live workers of the chosen scope"
            )
        selected = [by_instance[i] for i in instance_ids if i in by_instance]
    if not selected:
        blockers.append("no live workers in the chosen scope")
    staged = parsed.staged or instance_ids is not None
    if staged and target["method"] == "distributed":
        blockers.append(
            "a distributed update forms one collective group of every worker: it cannot run "
            "in waves, as a canary or on named instances; plan it all at once"
        )
    wave_of, wave_count, wave_blockers = assign_waves(
        parsed, [Placed(w.key, w.namespace, w.instance_id) for w in selected]
    )
    blockers += wave_blockers

    policy = source_policy(source)
    blockers += plan_level_blockers(source, verification=verification, policy=policy)
    group = group_plan(target, selected)
    blockers += group.pop("blockers", [])
    ranks = group.get("ranks", {})
    plans = [
        plan_worker(
            w,
            target=target,
            pause_mode=pause_mode,
            pause_modes=pause_modes,
            flush_policy=flush_policy,
            verification=verification,
            policy=policy or OutboundPolicy(()),
            fingerprint=fingerprint,
            rank=tuple(ranks[w.key]) if w.key in ranks else None,
            group_world_size=group.get("world_size"),
        )
        for w in selected
    ]
    blocked = sum(1 for p in plans if p.blockers)
    if blocked:
        blockers.append(f"{blocked} of {len(plans)} workers have blockers")

    with transaction.atomic():
        refresh = PolicyRefresh.objects.create(
            source=source,
            namespaces=namespaces,
            worker_keys=subset_keys,
            target=target,
            pause_mode=pause_mode,
            pause_modes=pause_modes,
            flush_policy=flush_policy,
            verification=verification,
            fingerprint=fingerprint,
            group=group,
            compat=compat_at_plan(source, target, verification, plans, group, run, versions),
            plan_blockers=blockers,
            plan_membership=membership,
            discovery_run=run,
            requested_by=actor.user,
            requested_by_label=actor.label[:200],
            rollback_of=rollback_of,
            strategy=parsed.to_dict(),
            instances=instance_ids,
            waves=max(wave_count, 1),
        )
        PlannedWorker.objects.bulk_create(
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
                wave=wave_of.get(p.worker.key, 1),
            )
            for p in plans
        )
        audit_refresh(
            AuditAction.POLICY_REFRESH_PLANNED,
            refresh,
            actor,
            source=source.name,
            namespaces=namespaces,
            target=target,
            workers=len(plans),
            blockers=blockers,
            rollback_of=rollback_of.pk if rollback_of else None,
            agreement=verification["agreement"],
            fingerprint=fingerprint,
            pause_modes=pause_modes,
            world_size=group.get("world_size"),
            strategy=parsed.to_dict(),
            waves=wave_count,
            instances=instance_ids,
        )
    return refresh
