"""The plan-wide judgements: the source's outbound policy and frontend, and a distributed
refresh's collective group (its rank map and the mixes it refuses)."""

from __future__ import annotations

from controlplane.dynamo.families import UpdateMethod
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet.models import Worker
from controlplane.refresh.handshake import GroupPlan
from controlplane.refresh.targets import Target


def source_policy(source) -> OutboundPolicy | None:
    """The source's outbound policy; None when its allowed networks do not parse."""
    try:
        return OutboundPolicy.from_cidrs(source.allowed_networks or [])
    except ValueError:
        return None


def plan_level_blockers(source, *, verification, policy: OutboundPolicy | None) -> list[str]:
    blockers = []
    if policy is None:
        blockers.append("the source's allowed networks are invalid")
    if verification["generation"]:
        if not source.frontend_url:
            blockers.append("the generation check needs the source's frontend URL")
        elif policy is not None and (problem := policy.violation(source.frontend_url)):
            blockers.append(f"frontend URL outside the allowed networks: {problem}")
    return blockers


def assign_ranks(
    workers: list[Worker], trainer_ranks: int = 1
) -> tuple[dict[str, tuple[int, int]], int, list[str]]:
    """The rank map of a distributed group: per worker key (rank_offset, its ranks), the
    group's world size, and the keys that advertise no world size (no ranks can be given).

    The trainer holds ranks 0..trainer_ranks-1; workers follow in key order, each taking as
    many consecutive ranks as its advertised `world_size` (its tensor/pipeline ranks). The map
    is the plan's: `world_size` is only a count, recorded with its provenance and checked
    again before the group forms (`executor.distributed.topology_drift`); which rank is which
    device is the worker's own business."""
    ranks: dict[str, tuple[int, int]] = {}
    unknown: list[str] = []
    offset = trainer_ranks
    for worker in sorted(workers, key=lambda w: w.key):
        size = worker.world_size
        if not size:
            unknown.append(worker.key)
            continue
        ranks[worker.key] = (offset, int(size))
        offset += int(size)
    return ranks, offset, unknown


def group_plan(target: Target, workers: list[Worker]) -> GroupPlan:
    """A distributed refresh's group: the rank map and the mixes it refuses.

    Returns `{"world_size", "trainer_ranks", "ranks": {key: [offset, count]}, "blockers"}`
    (empty for other methods). One broadcast feeds one set of weights, so workers serving
    different models cannot share a group."""
    if target["method"] != UpdateMethod.DISTRIBUTED:
        return {}
    trainer_ranks = target["trainer_ranks"]
    ranks, world, unknown = assign_ranks(workers, trainer_ranks)
    blockers = []
    if unknown:
        blockers.append(
            f"{len(unknown)} workers advertise no world_size, so no ranks can be assigned "
            f"to them ({', '.join(unknown[:3])})"
        )
    models = sorted({w.model for w in workers if w.model})
    if len(models) > 1:
        blockers.append(
            "workers serve different models (" + ", ".join(models[:5]) + "): one broadcast "
            "cannot update them all; plan one refresh per model"
        )
    return {
        "world_size": world,
        "trainer_ranks": trainer_ranks,
        "ranks": {key: list(r) for key, r in ranks.items()},
        "blockers": blockers,
    }
