"""Building a stored plan: per worker, its family, each step's exact calls, and its blockers.

Pure with respect to the network: it reads the Worker rows a fresh discovery refresh just
wrote (see `intents.plan.plan_policy_refresh`) and judges them. A plan with any blocker — on a
worker or plan-wide — cannot start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError

from controlplane.dynamo.families import (
    FAMILIES,
    AdminCall,
    AdminFamily,
    LoraAction,
    Operation,
    UpdateMethod,
    custom_call,
    detect_family,
    negotiate,
)
from controlplane.dynamo.families.sglang import SglangFamily
from controlplane.dynamo.families.sglang_routes import route_bindings
from controlplane.dynamo.fingerprint import AgreementRule, Fingerprint
from controlplane.dynamo.generation import GenerationCheck
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet.models import Worker, WorkerState
from controlplane.refresh.step_order import StepName
from controlplane.refresh.targets import (
    AUTO,
    PAUSE_MODE_CHOICES,
    RANK_KEYS,
    RELEASE_MEMORY,
    SIDECAR_UPDATE_KEYS,
    family_pause_modes,
    normalize_pause_modes,
    normalize_target,
)

GENERATION = "generation"
DEFAULT_VERIFICATION = {
    "version_readback": True,
    "liveness": True,
    "generation": True,
    "prompt_token_ids": [5, 6, 7, 8],
    "max_tokens": 4,
    "expected_model": "",
    # Copied from the source at plan time (see `agreement_rule_of`), so the rule a refresh was
    # planned with is the one it is verified with.
    "agreement": AgreementRule().to_dict(),
}


def agreement_rule_of(source) -> AgreementRule:
    """The source's cross-worker agreement rule (fleet.Source agreement_* fields)."""
    return AgreementRule(
        kind=source.agreement_rule,
        tokens=source.agreement_tokens,
        epsilon=source.agreement_epsilon,
    )


def normalize_fingerprint(raw: Any) -> dict[str, Any] | None:
    """Validate a trainer fingerprint (None or empty = none); raises ValidationError."""
    if raw is None or raw == {}:
        return None
    try:
        return Fingerprint.from_dict(raw).to_dict()
    except ValueError as exc:
        raise ValidationError(f"fingerprint: {exc}") from None


def generation_tokens(verification: dict[str, Any], fingerprint: dict[str, Any] | None) -> int:
    """How many tokens the generation check asks for: enough for the agreement window and for
    every fingerprint value, never fewer than the operator asked."""
    rule = AgreementRule.from_dict(verification.get("agreement"))
    wanted = [verification["max_tokens"], rule.tokens]
    if fingerprint:
        wanted.append(Fingerprint.from_dict(fingerprint).length)
    return max(wanted)


__all__ = [
    "AUTO",
    "PAUSE_MODE_CHOICES",
    "RANK_KEYS",
    "normalize_pause_modes",
    "normalize_target",
]


def normalize_verification(verification: dict[str, Any] | None) -> dict[str, Any]:
    merged = {**DEFAULT_VERIFICATION, **(verification or {})}
    ids = merged["prompt_token_ids"]
    if merged["generation"]:
        if not isinstance(ids, list | tuple) or not ids:
            raise ValidationError("the generation check needs prompt token ids")
        try:
            merged["prompt_token_ids"] = [int(i) for i in ids]
            merged["max_tokens"] = int(merged["max_tokens"])
            GenerationCheck("m", tuple(merged["prompt_token_ids"]), merged["max_tokens"])
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"generation check: {exc}") from None
    merged["expected_model"] = merged.get("expected_model") or ""
    try:
        merged["agreement"] = AgreementRule.from_dict(merged.get("agreement")).to_dict()
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"agreement rule: {exc}") from None
    return merged


def update_operation(target: dict[str, Any]) -> Operation:
    return {
        UpdateMethod.DISK: Operation.UPDATE_FROM_DISK,
        UpdateMethod.DISTRIBUTED: Operation.UPDATE_FROM_DISTRIBUTED,
        UpdateMethod.TENSOR: Operation.UPDATE_FROM_TENSOR,
        UpdateMethod.LORA: Operation.SET_WEIGHT_VERSION,
        UpdateMethod.CUSTOM: Operation.CUSTOM,
    }[UpdateMethod(target["method"])]


def update_is_idempotent(family_name: str, target: dict[str, Any]) -> bool:
    """Whether re-running the update after an unknown outcome is safe.

    A disk reload of the same path and version lands the same weights (vLLM, SGLang). A
    distributed update depends on a trainer-side broadcast that will not be repeated.
    """
    if target["method"] == UpdateMethod.LORA:
        # Load and unload are idempotent in Dynamo (a repeat says "already loaded"/fails
        # "not found" without harm); a swap repeated is another swap of the same adapter.
        return target["lora"]["action"] == LoraAction.LOAD
    return target["method"] == "disk" and family_name in ("vllm", "sglang")


def _serialize(calls: list[AdminCall]) -> list[dict[str, Any]]:
    return [
        {"operation": c.operation.value, "method": c.method, "path": c.path, "body": c.body}
        for c in calls
    ]


@dataclass
class WorkerPlan:
    worker: Worker
    family: str = ""
    calls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    blockers: list[str] = field(default_factory=list)
    flush_skipped: str = ""
    #: The update method this worker gets and why (the family's negotiated capability).
    update_method: str = ""
    method_reason: str = ""
    pause_mode: str = ""
    #: Distributed only: its first rank in the collective group and how many ranks it has.
    rank_offset: int | None = None
    ranks: int | None = None


#: Sub-phases of the update step of a distributed refresh (keys of `PlannedWorker.calls`):
#: every rank joins the group, then (after the trainer's broadcast) `update` applies and reads
#: the version back, then the group is torn down.
GROUP_INIT = "group_init"
GROUP_DESTROY = "group_destroy"


def _routes_of(worker: Worker) -> list[str]:
    if worker.static_worker is not None:
        return list(worker.static_worker.allowed_routes)
    return list(worker.routes or [])


def _family_of(worker: Worker, routes: list[str]) -> AdminFamily | None:
    if worker.family in FAMILIES:
        return FAMILIES[worker.family]
    return detect_family(routes)


def _bind(family: AdminFamily, routes: list[str]) -> tuple[AdminFamily, list[str]]:
    """SGLang allowlists may carry `--engine-route` descriptors (`flush=flush_cache:engine`):
    the family then calls the bound path for that operation. Raises ValueError."""
    if isinstance(family, SglangFamily):
        paths, methods = route_bindings(routes)
        return family.bound(methods), paths
    return family, routes


def assign_ranks(
    workers: list[Worker], trainer_ranks: int = 1
) -> tuple[dict[str, tuple[int, int]], int, list[str]]:
    """The rank map of a distributed group: per worker key (rank_offset, its ranks), the
    group's world size, and the keys that advertise no world size (no ranks can be given).

    The trainer holds ranks 0..trainer_ranks-1; workers follow in key order, each taking as
    many consecutive ranks as its advertised `world_size` (its tensor/pipeline ranks)."""
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


def _init_params(family: AdminFamily, group: dict[str, Any], rank_offset: int, world: int):
    """Sidecars take the group as `init_info`; Python vLLM and SGLang take it flat."""
    info = {**group, "rank_offset": rank_offset, "world_size": world}
    if family.name == "vllm-sidecar":
        return {"init_info": info}
    return info


def _update_params(family: AdminFamily, update: dict[str, Any], version: Any) -> dict[str, Any]:
    if family.name == "vllm-sidecar":
        params = {k: update[k] for k in SIDECAR_UPDATE_KEYS if k in update}
    else:
        params = {k: v for k, v in update.items() if k not in SIDECAR_UPDATE_KEYS}
    return {**params, "weight_version": version}


def plan_worker(
    worker: Worker,
    *,
    target: dict[str, Any],
    pause_mode: str,
    flush_policy: str,
    verification: dict[str, Any],
    policy: OutboundPolicy,
    fingerprint: dict[str, Any] | None = None,
    pause_modes: dict[str, str] | None = None,
    rank: tuple[int, int] | None = None,
    group_world_size: int | None = None,
) -> WorkerPlan:
    plan = WorkerPlan(worker)
    blockers = plan.blockers
    if worker.state == WorkerState.ERRORING or worker.error:
        blockers.append(f"probe error: {worker.error or 'worker reported an error'}")
    if not worker.system_url:
        blockers.append("no system_url advertised (worker started without a system port)")
    else:
        problem = policy.violation(worker.system_url)
        if problem:
            blockers.append(f"system_url outside the allowed networks: {problem}")
    routes = _routes_of(worker)
    detected = _family_of(worker, routes)
    if detected is None:
        blockers.append("no known admin route family in the advertised routes")
        return plan
    plan.family = detected.name
    try:
        family, routes = _bind(detected, routes)
    except ValueError as exc:
        blockers.append(f"route allowlist: {exc}")
        return plan
    method = UpdateMethod(target["method"])
    static = worker.static_worker is not None
    lora = target.get("lora") or {}
    deal = negotiate(
        family,
        method,
        routes,
        static=static,
        lora_action=lora.get("action"),
        custom_route=target.get("route"),
    )
    plan.update_method = method.value
    plan.method_reason = deal.reason
    if not deal.ok:
        blockers.append(f"update: {deal.reason}")
    version = target["weight_version"]

    def build(step: str, op: Operation, **params: Any) -> list[AdminCall]:
        if not family.supports(op, routes):
            if op in family.routes:
                missing = ", ".join(sorted(family.missing_routes(op, routes)))
                blockers.append(f"{step}: missing route {missing}")
            else:
                blockers.append(f"{step}: {family.name} cannot {op.value}")
            return []
        try:
            return family.build(op, **params)
        except ValueError as exc:
            blockers.append(f"{step}: {exc}")
            return []

    requested = (pause_modes or {}).get(family.name, pause_mode)
    pause_calls: list[AdminCall] = []
    resume_calls: list[AdminCall] = []
    if requested == RELEASE_MEMORY:
        if RELEASE_MEMORY not in family_pause_modes(family):
            blockers.append(f"pause: {family.name} has no memory release")
        else:
            # Pause (SGLang's default abort), then free the KV cache; resume in reverse.
            plan.pause_mode = RELEASE_MEMORY
            pause_calls += build(StepName.PAUSE, Operation.PAUSE, mode=family.default_pause_mode)
            pause_calls += build(StepName.PAUSE, Operation.RELEASE_MEMORY, tags=["kv_cache"])
            resume_calls += build(
                StepName.RESUME_ENGINES, Operation.RESUME_MEMORY, tags=["kv_cache"]
            )
    else:
        try:
            plan.pause_mode = family.pause_mode_for(requested)
        except ValueError as exc:
            blockers.append(f"pause: {exc}")
        else:
            pause_calls += build(StepName.PAUSE, Operation.PAUSE, mode=plan.pause_mode)
    resume_calls += build(StepName.RESUME_ENGINES, Operation.RESUME)
    plan.calls[StepName.PAUSE] = _serialize(pause_calls)

    update_op = update_operation(target)
    update_calls: list[AdminCall] = []
    if not deal.ok:
        pass
    elif method == UpdateMethod.DISK:
        update_calls += build(
            StepName.UPDATE, update_op, model_path=target["model_path"], weight_version=version
        )
    elif method == UpdateMethod.DISTRIBUTED:
        if rank is None or group_world_size is None:
            blockers.append("update: no ranks for this worker (it advertises no world_size)")
        else:
            plan.rank_offset, plan.ranks = rank
            plan.calls[GROUP_INIT] = _serialize(
                build(
                    GROUP_INIT,
                    Operation.INIT_WEIGHTS_GROUP,
                    **_init_params(family, target["group"], rank[0], group_world_size),
                )
            )
            update_calls += build(
                StepName.UPDATE, update_op, **_update_params(family, target["update"], version)
            )
            # Read the version back before the group is torn down (the executor then destroys
            # it on every rank, success or not).
            update_calls += build(StepName.UPDATE, Operation.GET_WEIGHT_VERSION)
            destroy = Operation.DESTROY_WEIGHTS_GROUP
            plan.calls[GROUP_DESTROY] = _serialize(
                build(GROUP_DESTROY, destroy) if destroy in deal.operations else []
            )
    elif method == UpdateMethod.LORA:
        action = LoraAction(lora["action"])
        params = {"lora_name": lora["lora_name"]}
        if action != LoraAction.UNLOAD:
            params["uri"] = lora["uri"]
        update_calls += build(StepName.UPDATE, deal.operations[0], **params)
        update_calls += build(StepName.UPDATE, update_op, weight_version=version)
    elif method == UpdateMethod.TENSOR:
        update_calls += build(
            StepName.UPDATE, update_op, **{**target["update"], "weight_version": version}
        )
    elif method == UpdateMethod.CUSTOM:
        update_calls.append(custom_call(target["route"], target.get("body")))
        if family.supports(Operation.SET_WEIGHT_VERSION, routes):
            update_calls += build(
                StepName.UPDATE, Operation.SET_WEIGHT_VERSION, weight_version=version
            )
    plan.calls[StepName.UPDATE] = _serialize(update_calls)

    invalidates = family.update_invalidates_cache(update_op) or plan.pause_mode == RELEASE_MEMORY
    flush_route = family.supports(Operation.FLUSH_CACHE, routes)
    if invalidates and (flush_policy == "auto" or not flush_route):
        plan.flush_skipped = (
            f"{family.name} {update_op.value} already invalidates the prefix cache "
            "(DYNAMO_CONTRACT §4/§5)"
            if plan.pause_mode != RELEASE_MEMORY
            else f"{family.name} released its KV cache memory at pause"
        )
        plan.calls[StepName.FLUSH] = []
    else:
        plan.calls[StepName.FLUSH] = _serialize(build(StepName.FLUSH, Operation.FLUSH_CACHE))

    plan.calls[StepName.RESUME_ENGINES] = _serialize(resume_calls)

    verify: list[dict[str, Any]] = []
    if verification["version_readback"]:
        verify += _serialize(build(StepName.VERIFY, Operation.GET_WEIGHT_VERSION))
    if verification["liveness"]:
        verify += _serialize(build(StepName.VERIFY, Operation.LIVENESS))
        # Where the family has state routes (the sidecar), read them: `/health` stays ready
        # while paused, so only these say the engine runs and is awake again.
        for state_op in (Operation.IS_PAUSED, Operation.IS_SLEEPING):
            if family.supports(state_op, routes):
                verify += _serialize(build(StepName.VERIFY, state_op))
    if verification["generation"]:
        # A loaded adapter is served under its own name: the pinned generation names it.
        adapter = lora.get("lora_name") if lora.get("action") != LoraAction.UNLOAD else None
        model = adapter or verification["expected_model"] or worker.model
        if not model:
            blockers.append("verify: no model name for the generation check")
        else:
            # A trainer fingerprint may bring its own prompt: the one its ids were made from.
            prompt = (fingerprint or {}).get("prompt_token_ids") or verification["prompt_token_ids"]
            check = GenerationCheck(
                model=model,
                prompt_token_ids=tuple(prompt),
                max_tokens=generation_tokens(verification, fingerprint),
                backend_instance_id=int(worker.instance_id),
                expected_model=adapter or verification["expected_model"] or None,
            )
            spec = {
                "operation": GENERATION,
                "method": "POST",
                "path": "v1/completions",
                "body": check.request_body(),
                "expected_model": check.expected_model,
            }
            if fingerprint:
                spec["fingerprint"] = fingerprint
            verify.append(spec)
    plan.calls[StepName.VERIFY] = verify
    return plan


def group_plan(target: dict[str, Any], workers: list[Worker]) -> dict[str, Any]:
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


def source_policy(source) -> OutboundPolicy | None:
    try:
        return OutboundPolicy.from_cidrs(source.allowed_networks or [])
    except ValueError:
        return None


def generation_check_from_call(call: dict[str, Any]) -> GenerationCheck:
    """Rebuild the stored check; the plan keeps the exact request body."""
    body = call["body"]
    nvext = body.get("nvext") or {}
    return GenerationCheck(
        model=body["model"],
        prompt_token_ids=tuple(body["prompt"]),
        max_tokens=body["max_tokens"],
        backend_instance_id=nvext.get("backend_instance_id"),
        expected_model=call.get("expected_model"),
        fingerprint=Fingerprint.from_dict(call["fingerprint"]) if call.get("fingerprint") else None,
    )
