"""Update methods as first-class plans: what each method needs from each family.

A method is how new weights reach a worker. Each family offers a method only through the
routes it advertises (or, for a statically configured worker, the routes an operator
allowlisted): the method's capability set is a set of operations, each of which the family maps
to route names it calls verbatim. `negotiate` answers, for one worker, whether it can take the
method and why (the plan shows that reason), or which routes are missing.

Some pairs are refused whatever is advertised, because the contract says the route cannot do
the job: vLLM 1.6.1 advertises `update_weights_from_tensor` but always answers "not
implemented", and the native sidecar's LoRA routes were never exercised in 1.6.1.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from .base import AdminFamily, Operation


class UpdateMethod(enum.StrEnum):
    DISK = "disk"
    DISTRIBUTED = "distributed"
    LORA = "lora"
    TENSOR = "tensor"
    CUSTOM = "custom"
    #: The trainer's framework applies the weights itself (verl's CUDA IPC, NeMo RL's NCCL
    #: refit): no update route is called; the trainer reports `applied`, then the version is
    #: declared (`set_weight_version`, where advertised) and read back.
    EXTERNAL = "external"


class LoraAction(enum.StrEnum):
    LOAD = "load"
    UNLOAD = "unload"
    SWAP = "swap"


METHOD_LABELS = {
    UpdateMethod.DISK: "disk reload",
    UpdateMethod.DISTRIBUTED: "distributed (collective broadcast from the trainer)",
    UpdateMethod.LORA: "LoRA adapter",
    UpdateMethod.TENSOR: "tensor update",
    UpdateMethod.CUSTOM: "allowlisted custom route",
    UpdateMethod.EXTERNAL: "external (the trainer's framework applies the weights)",
}

_LORA_OP = {
    LoraAction.LOAD: Operation.LOAD_LORA,
    LoraAction.UNLOAD: Operation.UNLOAD_LORA,
    LoraAction.SWAP: Operation.SWAP_LORA,
}

#: (family, method) → the operations the method needs there. Absent = not offered.
NEEDS: dict[tuple[str, UpdateMethod], tuple[Operation, ...]] = {
    ("vllm", UpdateMethod.DISK): (Operation.UPDATE_FROM_DISK,),
    ("sglang", UpdateMethod.DISK): (Operation.UPDATE_FROM_DISK,),
    # Distributed: join, apply, read the version back before the group goes, destroy.
    ("vllm", UpdateMethod.DISTRIBUTED): (
        Operation.INIT_WEIGHTS_GROUP,
        Operation.UPDATE_FROM_DISTRIBUTED,
        Operation.GET_WEIGHT_VERSION,
        Operation.DESTROY_WEIGHTS_GROUP,
    ),
    # The sidecar has no teardown route: its transfer engine lives as long as the worker.
    ("vllm-sidecar", UpdateMethod.DISTRIBUTED): (
        Operation.INIT_WEIGHTS_GROUP,
        Operation.UPDATE_FROM_DISTRIBUTED,
        Operation.GET_WEIGHT_VERSION,
    ),
    ("sglang", UpdateMethod.DISTRIBUTED): (
        Operation.INIT_WEIGHTS_GROUP,
        Operation.UPDATE_FROM_DISTRIBUTED,
        Operation.GET_WEIGHT_VERSION,
        Operation.DESTROY_WEIGHTS_GROUP,
    ),
    # LoRA: the action's route, then the version declaration readback verifies.
    ("vllm", UpdateMethod.LORA): (Operation.SET_WEIGHT_VERSION,),
    ("sglang", UpdateMethod.TENSOR): (Operation.UPDATE_FROM_TENSOR,),
}

#: Pairs refused although the routes may be advertised, with the contract's reason.
REFUSED: dict[tuple[str, UpdateMethod], str] = {
    ("vllm", UpdateMethod.TENSOR): (
        "vLLM advertises update_weights_from_tensor but always answers 'not implemented' "
        "(docs: reference/backend-families)"
    ),
    ("vllm-sidecar", UpdateMethod.LORA): (
        "the native sidecar's LoRA routes are not part of the verified 1.6.1 surface "
        "(docs: reference/backend-families)"
    ),
    ("vllm-sidecar", UpdateMethod.DISK): (
        "the native sidecar has no disk reload route; use the distributed method"
    ),
    ("vllm-sidecar", UpdateMethod.TENSOR): "the native sidecar has no tensor update route",
}


@dataclass(frozen=True, slots=True)
class Negotiation:
    """One worker's answer for one method: `ok` with the reason shown in the plan, or why not."""

    method: UpdateMethod
    ok: bool
    reason: str
    operations: tuple[Operation, ...] = ()


def needed_operations(
    family: AdminFamily, method: UpdateMethod, *, lora_action: str | None = None
) -> tuple[Operation, ...] | None:
    """The capability set of `method` on `family`; None when the family does not offer it."""
    if method in (UpdateMethod.CUSTOM, UpdateMethod.EXTERNAL):
        return ()
    base = NEEDS.get((family.name, method))
    if base is None:
        return None
    if method == UpdateMethod.LORA:
        return (_LORA_OP[LoraAction(lora_action or LoraAction.LOAD)], *base)
    return base


def negotiate(
    family: AdminFamily,
    method: UpdateMethod,
    routes: Iterable[str],
    *,
    static: bool = False,
    lora_action: str | None = None,
    custom_route: str | None = None,
) -> Negotiation:
    """Can a worker of `family` with these advertised (or allowlisted) `routes` take `method`?"""
    routes = frozenset(routes)
    source = "allowlists" if static else "advertises"
    refused = REFUSED.get((family.name, method))
    if refused:
        return Negotiation(method, False, refused)
    if method == UpdateMethod.CUSTOM:
        if not static:
            return Negotiation(
                method,
                False,
                "a custom route is only called on a statically configured worker, where an "
                "operator allowlisted it",
            )
        if not custom_route or custom_route not in routes:
            return Negotiation(
                method, False, f"route {custom_route!r} is not in the worker's allowlist"
            )
        return Negotiation(
            method, True, f"{family.name} allowlists {custom_route}", (Operation.CUSTOM,)
        )
    if method == UpdateMethod.EXTERNAL:
        declared = family.supports(Operation.SET_WEIGHT_VERSION, routes)
        how = (
            "declared with set_weight_version"
            if declared
            else "not declared (no set_weight_version route), only read back"
        )
        return Negotiation(
            method,
            True,
            f"{family.name}: the trainer applies the weights and reports applied; the version "
            f"is {how}",
            (Operation.SET_WEIGHT_VERSION,) if declared else (),
        )
    ops = needed_operations(family, method, lora_action=lora_action)
    if ops is None:
        return Negotiation(method, False, f"{family.name} offers no {METHOD_LABELS[method]}")
    missing = sorted(set().union(*(family.missing_routes(op, routes) for op in ops)))
    if missing:
        return Negotiation(
            method,
            False,
            f"{family.name} {METHOD_LABELS[method]} needs {', '.join(missing)}, "
            f"which the worker does not {'allowlist' if static else 'advertise'}",
            ops,
        )
    used = sorted(set().union(*(family.required_routes(op) for op in ops)))
    return Negotiation(method, True, f"{family.name} {source} {', '.join(used)}", ops)


def offered_methods(family: AdminFamily, routes: Iterable[str], *, static: bool) -> list[str]:
    """Every method this worker could take (for the fleet and plan pages)."""
    routes = frozenset(routes)
    offered = [
        m.value
        for m in UpdateMethod
        if m != UpdateMethod.CUSTOM and negotiate(family, m, routes, static=static).ok
    ]
    if static:
        offered.append(UpdateMethod.CUSTOM.value)
    return offered
