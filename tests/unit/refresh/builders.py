"""Plain, unsaved workers of each admin route family, as discovery (or an operator) leaves them."""

from __future__ import annotations

from typing import Any

from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet.models import StaticWorker, Worker
from controlplane.refresh.planning import normalize_target, normalize_verification, plan_worker

#: Dynamo instance ids are u64 and often above 2^63: neither a float nor a signed bigint holds it.
BIG_INSTANCE_ID = 2**64 - 5
POLICY = OutboundPolicy.from_cidrs(["10.0.0.0/8"])
MODEL = "Qwen/Qwen3-0.6B"

VLLM_ROUTES = [
    "liveness_probe",
    "pause_generation",
    "resume_generation",
    "flush_cache",
    "update_weights_from_disk",
    "init_weights_update_group",
    "update_weights_from_distributed",
    "destroy_weights_update_group",
    "get_weight_version",
    "set_weight_version",
]
SIDECAR_ROUTES = [
    "control/pause_generation",
    "control/resume_generation",
    "control/get_weight_version",
    "control/is_paused",
    "update/init_weight_transfer_engine",
    "update/start_weight_update",
    "update/update_weights",
    "update/finish_weight_update",
    "update/update_weight_version",
    "update/model_taints",
]
SGLANG_ROUTES = [
    "pause_generation",
    "continue_generation",
    "flush_cache",
    "control/update_weights_from_disk",
    "init_weights_update_group",
    "control/update_weights_from_distributed",
    "destroy_weights_update_group",
    "get_weight_version",
    "control/update_weight_version",
]

DISK = {"weight_version": "v7", "method": "disk", "model_path": "/ckpt/v7"}


def discovered(family: str, advertised: list[str], **fields: Any) -> Worker:
    """`fields` override anything, `routes` (the advertised list) included."""
    values = {
        "namespace": "rl-a",
        "component": "backend",
        "endpoint": "generate",
        "instance_id": str(BIG_INSTANCE_ID),
        "family": family,
        "system_url": "http://10.0.0.5:9090",
        "model": MODEL,
        "world_size": 1,
        "routes": list(fields.pop("routes", advertised)),
        **fields,
    }
    return Worker(**values)


def vllm_worker(**fields: Any) -> Worker:
    return discovered("vllm", VLLM_ROUTES, **fields)


def sidecar_worker(**fields: Any) -> Worker:
    return discovered("vllm-sidecar", SIDECAR_ROUTES, **fields)


def sglang_static_worker(allowed_routes: list[str] | None = None, **fields: Any) -> Worker:
    """SGLang is registered, not discovered: its routes are the operator's allowlist."""
    static = StaticWorker(
        pk=41,
        name="sgl-1",
        namespace="rl-a",
        system_url="http://10.0.0.7:30000",
        family="sglang",
        allowed_routes=SGLANG_ROUTES if allowed_routes is None else allowed_routes,
        model=MODEL,
    )
    values = {"system_url": static.system_url, **fields}
    worker = discovered("sglang", [], **values)
    worker.static_worker = static
    return worker


def plan(
    worker: Worker,
    target: dict[str, Any] = DISK,
    *,
    pause_mode: str = "keep",
    flush_policy: str = "auto",
    verification: dict[str, Any] | None = None,
    policy: OutboundPolicy = POLICY,
    pause_modes: dict[str, str] | None = None,
    trainer_applies: bool = True,
):
    """One worker's plan; a distributed one puts the worker right after a one-rank trainer.
    An external one is a refresh's (the trainer applies) unless `trainer_applies` is False."""
    target = normalize_target(target)
    rank = world = None
    if target["method"] == "distributed" and worker.world_size:
        rank, world = (1, worker.world_size), 1 + worker.world_size
    return plan_worker(
        worker,
        target=target,
        pause_mode=pause_mode,
        pause_modes=pause_modes,
        flush_policy=flush_policy,
        verification=normalize_verification(verification),
        policy=policy,
        rank=rank,
        group_world_size=world,
        trainer_applies=trainer_applies,
    )


def call(operation: str, path: str, body: Any = None, method: str = "POST") -> dict[str, Any]:
    return {"operation": operation, "method": method, "path": path, "body": body}
