"""One worker's plan: its family, each step's exact calls, and its blockers, built by passes.

Pure with respect to the network: it reads the Worker row a fresh discovery just wrote (see
`intents.plan.plan_policy_refresh`) and judges it. The plan is built by ordered, named passes
(`WORKER_PASSES`), each adding the calls of its step and returning its own blockers; a plan
with any blocker cannot start. Two passes can end a plan early: a worker with no known admin
route family, or an allowlist that does not parse, has no calls to plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Required, TypedDict, cast

from controlplane.dynamo.families import (
    FAMILIES,
    AdminCall,
    AdminFamily,
    FamilyVerdict,
    LoraAction,
    Negotiation,
    Operation,
    UpdateMethod,
    custom_call,
    family_verdict,
    for_release,
    negotiate,
)
from controlplane.dynamo.families.sglang import SglangFamily
from controlplane.dynamo.families.sglang_routes import route_bindings
from controlplane.dynamo.fingerprint import FingerprintJson
from controlplane.dynamo.generation import GenerationCheck
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.dynamo.releases import DECLARED_REQUIRED, contract, readback_rule
from controlplane.fleet.models import Worker, WorkerState
from controlplane.refresh.planning.verification import (
    GENERATION,
    Verification,
    generation_tokens,
)
from controlplane.refresh.step_order import StepName
from controlplane.refresh.targets import (
    RELEASE_MEMORY,
    SIDECAR_UPDATE_KEYS,
    LoraTarget,
    PauseModes,
    Target,
    family_pause_modes,
)


def update_operation(target: Target) -> Operation:
    return {
        UpdateMethod.DISK: Operation.UPDATE_FROM_DISK,
        UpdateMethod.DISTRIBUTED: Operation.UPDATE_FROM_DISTRIBUTED,
        UpdateMethod.TENSOR: Operation.UPDATE_FROM_TENSOR,
        UpdateMethod.LORA: Operation.SET_WEIGHT_VERSION,
        UpdateMethod.CUSTOM: Operation.CUSTOM,
        # The weights arrive outside Dynamo's routes; the plan's own call is the declaration.
        UpdateMethod.EXTERNAL: Operation.SET_WEIGHT_VERSION,
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
    if target["method"] == UpdateMethod.EXTERNAL:
        # Only the declaration and the readback are called, after the trainer's report: both
        # land the same result again.
        return True
    return target["method"] == "disk" and family_name in ("vllm", "sglang")


class PlannedCall(TypedDict, total=False):
    """One planned call of a step, as `PlannedWorker.calls` stores it; this module owns its
    keys. An admin call has the first four; the verify step's pinned generation adds the model
    it expects and the trainer's fingerprint, when one was given."""

    #: An admin `Operation` value, or `GENERATION` for the pinned generation.
    operation: Required[str]
    method: Required[str]
    #: Relative to the worker's system URL (the generation: to the frontend's).
    path: Required[str]
    #: The request body as the family builds it (None: the call sends none).
    body: Required[dict[str, Any] | None]
    expected_model: str | None
    fingerprint: FingerprintJson
    #: A version readback under a release whose rule is not the default: how the engine's
    #: `version_declared` is read (`releases.readback_rule`).
    declared: str


#: `PlannedWorker.calls`: step name (or distributed sub-phase) → its calls, in order.
PlannedCalls = dict[str, list[PlannedCall]]


def _serialize(calls: list[AdminCall]) -> list[PlannedCall]:
    return [
        PlannedCall(operation=c.operation.value, method=c.method, path=c.path, body=c.body)
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


def _family_of(worker: Worker, routes: list[str]) -> FamilyVerdict:
    """A static worker's family is its registration. A discovered worker's comes from its
    routes where they identify the engine, else from the operator's declaration for its
    source or namespace; native sidecar routes alone are ambiguous and refused."""
    if worker.static_worker is not None and worker.family in FAMILIES:
        return FamilyVerdict(FAMILIES[worker.family], evidence="declared")
    declared = worker.source.declared_family_for(worker.namespace) if worker.source_id else ""
    return family_verdict(routes, declared)


def _release_of(worker: Worker) -> str:
    """The Dynamo release the worker's source declares (blank: the default)."""
    return (worker.source.dynamo_release or "") if worker.source_id else ""


def _bind(family: AdminFamily, routes: list[str]) -> tuple[AdminFamily, list[str]]:
    """SGLang allowlists may carry `--engine-route` descriptors (`flush=flush_cache:engine`):
    the family then calls the bound path for that operation. Raises ValueError."""
    if isinstance(family, SglangFamily):
        paths, methods = route_bindings(routes)
        return family.bound(methods), paths
    return family, routes


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


#: The order of a plan's `calls` keys: the executor's steps, with a distributed update's group
#: sub-phases around it (the stored order; the passes fill them in another order).
STORED_ORDER = (
    StepName.PAUSE,
    GROUP_INIT,
    GROUP_DESTROY,
    StepName.UPDATE,
    StepName.FLUSH,
    StepName.RESUME_ENGINES,
    StepName.VERIFY,
)


@dataclass(frozen=True)
class WorkerRequest:
    """What the operator asked of every worker of the plan (already validated), and this
    worker's ranks in a distributed group."""

    target: Target
    pause_mode: str
    flush_policy: str
    verification: Verification
    policy: OutboundPolicy
    fingerprint: FingerprintJson | None = None
    pause_modes: PauseModes | None = None
    rank: tuple[int, int] | None = None
    group_world_size: int | None = None
    #: A trainer applies the weights of an `external` policy (a policy refresh, which
    #: announces `ready_for_apply` and waits for its report). Without one — a drifted worker's
    #: catch-up, a canary's rollback — nothing could load them, so the plan is blocked.
    trainer_applies: bool = False


@dataclass
class Draft:
    """A worker's plan while the passes build it: the plan, and what the passes share."""

    plan: WorkerPlan
    request: WorkerRequest
    #: Set by the family pass: the worker's admin route family (bound to its allowlist's
    #: route descriptors) and the routes it may call.
    family: AdminFamily | None = None
    routes: list[str] = field(default_factory=list)
    #: Set by the negotiation pass: whether the family can take the update method.
    deal: Negotiation | None = None
    #: Set by a pass that finds nothing more can be planned (the later passes are skipped).
    stop: bool = False
    #: Each step's calls, serialized as stored.
    calls: PlannedCalls = field(default_factory=dict)

    @property
    def worker(self) -> Worker:
        return self.plan.worker

    def bound(self) -> tuple[AdminFamily, list[str]]:
        """The family and routes; only passes after the family pass ask (it stops otherwise)."""
        if self.family is None:
            raise RuntimeError("a call pass ran before the family pass found a family")
        return self.family, self.routes

    def builder(self, blockers: list[str]) -> Callable[..., list[AdminCall]]:
        """`build(step, operation, **params)`: the calls of one operation, or none and a
        blocker (appended to the pass's own list, in the order the pass asks)."""
        family, routes = self.bound()

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

        return build


def reachability_pass(draft: Draft) -> list[str]:
    """The worker answers its probe, and its system URL is advertised and allowed."""
    worker, policy = draft.worker, draft.request.policy
    blockers = []
    if worker.state == WorkerState.ERRORING or worker.error:
        blockers.append(f"probe error: {worker.error or 'worker reported an error'}")
    if not worker.system_url:
        blockers.append("no system_url advertised (worker started without a system port)")
    else:
        problem = policy.violation(worker.system_url)
        if problem:
            blockers.append(f"system_url outside the allowed networks: {problem}")
    return blockers


def family_pass(draft: Draft) -> list[str]:
    """The admin route family: the stored one, else detected from the routes; SGLang's bound
    to the allowlist's route descriptors. Without one, nothing more can be planned."""
    routes = _routes_of(draft.worker)
    verdict = _family_of(draft.worker, routes)
    detected = verdict.family
    if detected is None:
        draft.stop = True
        return [verdict.reason]
    draft.plan.family = detected.name
    release = _release_of(draft.worker)
    # The adapter of the source's release: its route tables, bodies and success rules.
    detected = for_release(detected.name, release)
    try:
        draft.family, draft.routes = _bind(detected, routes)
    except ValueError as exc:
        draft.stop = True
        return [f"route allowlist: {exc}"]
    if isinstance(draft.family, SglangFamily) and (gone := draft.family.gone_routes(routes)):
        return [
            f"route allowlist: {', '.join(gone)} no longer exist in Dynamo "
            f"{contract(release).name} (memory occupation is release_memory_occupation and "
            "resume_memory_occupation at the top of /engine/)"
        ]
    return []


def negotiation_pass(draft: Draft) -> list[str]:
    """Whether the family, with these routes, can take the update method (and why)."""
    family, routes = draft.bound()
    target = draft.request.target
    method = UpdateMethod(target["method"])
    lora: LoraTarget | dict[str, str] = target.get("lora") or {}
    draft.deal = negotiate(
        family,
        method,
        routes,
        static=draft.worker.static_worker is not None,
        lora_action=lora.get("action"),
        custom_route=target.get("route"),
    )
    draft.plan.update_method = method.value
    draft.plan.method_reason = draft.deal.reason
    return [] if draft.deal.ok else [f"update: {draft.deal.reason}"]


def pause_pass(draft: Draft) -> list[str]:
    """Pause and the resume that undoes it, planned together: the family's pause mode (the
    per-family choice over the plan-wide one), or pause then memory release."""
    family, _ = draft.bound()
    request, plan = draft.request, draft.plan
    blockers: list[str] = []
    build = draft.builder(blockers)
    requested = (request.pause_modes or {}).get(family.name, request.pause_mode)
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
    draft.calls[StepName.PAUSE] = _serialize(pause_calls)
    draft.calls[StepName.RESUME_ENGINES] = _serialize(resume_calls)
    return blockers


def update_pass(draft: Draft) -> list[str]:
    """The update's calls for the method (none when the family cannot take it: the
    negotiation pass said why); a distributed update also joins and leaves the group."""
    family, routes = draft.bound()
    deal, target = draft.deal, draft.request.target
    blockers: list[str] = []
    build = draft.builder(blockers)
    method = UpdateMethod(target["method"])
    update_op = update_operation(target)
    version = target["weight_version"]
    lora: LoraTarget | dict[str, str] = target.get("lora") or {}
    update_calls: list[AdminCall] = []
    if deal is None or not deal.ok:
        pass
    elif method == UpdateMethod.DISK:
        update_calls += build(
            StepName.UPDATE, update_op, model_path=target["model_path"], weight_version=version
        )
    elif method == UpdateMethod.DISTRIBUTED:
        update_calls += _distributed_calls(draft, deal, build, blockers)
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
    elif method == UpdateMethod.EXTERNAL and not draft.request.trainer_applies:
        # Declaring the version without the trainer's transfer would admit old weights as new.
        blockers.append(
            "update: an external policy's weights are applied by the trainer's framework; "
            "only a policy refresh (which waits for its applied report) can load them"
        )
    elif method == UpdateMethod.EXTERNAL:
        update_calls += _external_calls(family, routes, build, version)
    elif method == UpdateMethod.CUSTOM:
        update_calls.append(custom_call(target["route"], target.get("body")))
        if family.supports(Operation.SET_WEIGHT_VERSION, routes):
            update_calls += build(
                StepName.UPDATE, Operation.SET_WEIGHT_VERSION, weight_version=version
            )
    draft.calls[StepName.UPDATE] = _serialize(update_calls)
    return blockers


def _external_calls(
    family: AdminFamily, routes: list[str], build: Callable[..., list[AdminCall]], version: Any
) -> list[AdminCall]:
    """After the trainer's `applied` report: declare the version where the worker advertises
    `set_weight_version`, then read it back where it advertises `get_weight_version` (the
    executor expects the refresh's version). No update route is called: the trainer's framework
    applied the weights itself."""
    calls: list[AdminCall] = []
    if family.supports(Operation.SET_WEIGHT_VERSION, routes):
        calls += build(StepName.UPDATE, Operation.SET_WEIGHT_VERSION, weight_version=version)
    if family.supports(Operation.GET_WEIGHT_VERSION, routes):
        calls += build(StepName.UPDATE, Operation.GET_WEIGHT_VERSION)
    return calls


def _distributed_calls(
    draft: Draft,
    deal: Negotiation,
    build: Callable[..., list[AdminCall]],
    blockers: list[str],
) -> list[AdminCall]:
    """Join the group at the worker's ranks, apply and read the version back; the group's
    teardown is stored on its own (the executor runs it on every rank, success or not)."""
    family, _ = draft.bound()
    request, plan = draft.request, draft.plan
    target, rank = request.target, request.rank
    if rank is None or request.group_world_size is None:
        blockers.append("update: no ranks for this worker (it advertises no world_size)")
        return []
    plan.rank_offset, plan.ranks = rank
    draft.calls[GROUP_INIT] = _serialize(
        build(
            GROUP_INIT,
            Operation.INIT_WEIGHTS_GROUP,
            **_init_params(family, target["group"], rank[0], request.group_world_size),
        )
    )
    version = target["weight_version"]
    calls = build(
        StepName.UPDATE,
        update_operation(target),
        **_update_params(family, target["update"], version),
    )
    # Read the version back before the group is torn down.
    calls += build(StepName.UPDATE, Operation.GET_WEIGHT_VERSION)
    destroy = Operation.DESTROY_WEIGHTS_GROUP
    draft.calls[GROUP_DESTROY] = _serialize(
        build(GROUP_DESTROY, destroy) if destroy in deal.operations else []
    )
    return calls


def flush_pass(draft: Draft) -> list[str]:
    """Flush the prefix cache, unless the update (or a memory release at pause) already
    invalidated it — also under `flush_policy=always` when the family has no flush route."""
    family, routes = draft.bound()
    plan = draft.plan
    update_op = update_operation(draft.request.target)
    invalidates = family.update_invalidates_cache(update_op) or plan.pause_mode == RELEASE_MEMORY
    flush_route = family.supports(Operation.FLUSH_CACHE, routes)
    if invalidates and (draft.request.flush_policy == "auto" or not flush_route):
        plan.flush_skipped = (
            f"{family.name} {update_op.value} already invalidates the prefix cache "
            "(docs: reference/backend-families)"
            if plan.pause_mode != RELEASE_MEMORY
            else f"{family.name} released its KV cache memory at pause"
        )
        draft.calls[StepName.FLUSH] = []
        return []
    blockers: list[str] = []
    draft.calls[StepName.FLUSH] = _serialize(
        draft.builder(blockers)(StepName.FLUSH, Operation.FLUSH_CACHE)
    )
    return blockers


def verify_pass(draft: Draft) -> list[str]:
    """The verification the operator switched on: version read-back, liveness (and the
    family's state routes), and a generation pinned to this worker."""
    family, routes = draft.bound()
    verification = draft.request.verification
    blockers: list[str] = []
    build = draft.builder(blockers)
    verify: list[PlannedCall] = []
    if verification["version_readback"]:
        verify += _serialize(build(StepName.VERIFY, Operation.GET_WEIGHT_VERSION))
    if verification["liveness"]:
        verify += _serialize(build(StepName.VERIFY, Operation.LIVENESS))
        # Where the family has state routes (the sidecar), read them: `/health` stays ready
        # while paused, so only these say the engine runs and is awake again.
        for state_op in (Operation.IS_PAUSED, Operation.IS_SLEEPING):
            if family.supports(state_op, routes):
                verify += _serialize(build(StepName.VERIFY, state_op))
    if verification["generation"] and not draft.worker.instance_id:
        # A static worker whose identity is unknown: nothing registered at the frontend is
        # known to be it, so no generation can be pinned to it. It is refreshed by its URL
        # and never enters a verified set (the refresh page says so).
        pass
    elif verification["generation"]:
        spec, blocker = _generation_call(draft)
        if blocker:
            blockers.append(blocker)
        else:
            verify.append(spec)
    draft.calls[StepName.VERIFY] = verify
    return blockers


#: What `_generation_call` returns with a blocker (the caller stores no call).
_NO_CALL = PlannedCall(operation=GENERATION, method="POST", path="", body=None)


def _generation_call(draft: Draft) -> tuple[PlannedCall, str]:
    """The pinned generation of the verify step, or the blocker that prevents it."""
    worker, verification = draft.worker, draft.request.verification
    fingerprint = draft.request.fingerprint
    lora: LoraTarget | dict[str, str] = draft.request.target.get("lora") or {}
    # A loaded adapter is served under its own name: the pinned generation names it.
    adapter = lora.get("lora_name") if lora.get("action") != LoraAction.UNLOAD else None
    model = adapter or verification["expected_model"] or worker.model
    if not model:
        return _NO_CALL, "verify: no model name for the generation check"
    # A trainer fingerprint may bring its own prompt: the one its ids were made from.
    prompt = (fingerprint or {}).get("prompt_token_ids") or verification["prompt_token_ids"]
    check = GenerationCheck(
        model=model,
        prompt_token_ids=tuple(prompt),
        max_tokens=generation_tokens(verification, fingerprint),
        backend_instance_id=int(worker.instance_id),
        expected_model=adapter or verification["expected_model"] or None,
    )
    body = check.request_body()
    family = draft.family
    if (
        family is not None
        and family.name == "vllm-sidecar"
        and not contract(_release_of(worker)).rules.sidecar_extra_args
        and "extra_args" in (body.get("sampling_params") or {})
    ):
        return _NO_CALL, "verify: this release's vLLM sidecar rejects sampling_params.extra_args"
    spec = PlannedCall(
        operation=GENERATION,
        method="POST",
        path="v1/completions",
        body=body,
        expected_model=check.expected_model,
    )
    if fingerprint:
        spec["fingerprint"] = fingerprint
    return spec, ""


#: The passes in order: each adds what it plans to the draft and returns its own blockers, which
#: the plan keeps in this order (a page lists them so: reachability first, verification last).
WORKER_PASSES: tuple[tuple[str, Callable[[Draft], list[str]]], ...] = (
    ("reachability", reachability_pass),
    ("family", family_pass),
    ("negotiation", negotiation_pass),
    ("pause", pause_pass),
    ("update", update_pass),
    ("flush", flush_pass),
    ("verify", verify_pass),
)


def plan_worker(
    worker: Worker,
    *,
    target: Target,
    pause_mode: str,
    flush_policy: str,
    verification: Verification,
    policy: OutboundPolicy,
    fingerprint: FingerprintJson | None = None,
    pause_modes: PauseModes | None = None,
    rank: tuple[int, int] | None = None,
    group_world_size: int | None = None,
    trainer_applies: bool = False,
) -> WorkerPlan:
    """The worker's plan: its calls per step and every blocker the passes found."""
    request = WorkerRequest(
        target=target,
        pause_mode=pause_mode,
        flush_policy=flush_policy,
        verification=verification,
        policy=policy,
        fingerprint=fingerprint,
        pause_modes=pause_modes,
        rank=rank,
        group_world_size=group_world_size,
        trainer_applies=trainer_applies,
    )
    draft = Draft(WorkerPlan(worker), request)
    for _name, worker_pass in WORKER_PASSES:
        draft.plan.blockers += worker_pass(draft)
        if draft.stop:
            break
    if draft.family is not None:
        _mark_readbacks(draft)
    # The executor reads stored calls as plain JSON objects (`PlannedWorker.calls`).
    draft.plan.calls = cast(
        dict[str, list[dict[str, Any]]],
        {step: draft.calls[step] for step in STORED_ORDER if step in draft.calls},
    )
    return draft.plan


def _mark_readbacks(draft: Draft) -> None:
    """Each version readback carries how its `version_declared` is read under the source's
    release (`releases.readback_rule`); the default (required) is left implicit, so plans
    of the default release are stored as they always were."""
    family, routes = draft.bound()
    rule = readback_rule(_release_of(draft.worker), family.name, routes)
    if rule == DECLARED_REQUIRED:
        return
    for step, calls in draft.calls.items():
        if step not in STORED_ORDER:
            continue
        for spec in calls:
            if spec.get("operation") == Operation.GET_WEIGHT_VERSION.value:
                spec["declared"] = rule
