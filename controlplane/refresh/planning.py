"""Building a stored plan: per worker, its family, each step's exact calls, and its blockers.

Pure with respect to the network: it reads the Worker rows a fresh discovery refresh just
wrote (see `actions.plan_policy_refresh`) and judges them. A plan with any blocker — on a
worker or plan-wide — cannot start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError

from controlplane.dynamo.families import FAMILIES, AdminCall, AdminFamily, Operation, detect_family
from controlplane.dynamo.fingerprint import AgreementRule, Fingerprint
from controlplane.dynamo.generation import GenerationCheck
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet.models import Worker, WorkerState
from controlplane.refresh.sequence import StepName

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


def normalize_target(target: dict[str, Any]) -> dict[str, Any]:
    """Validate a target policy; raises ValidationError with a message a person can act on."""
    if not isinstance(target, dict):
        raise ValidationError("target must be an object")
    version = target.get("weight_version")
    if version in (None, ""):
        raise ValidationError("target needs a weight_version")
    method = target.get("method", "disk")
    if method == "disk":
        path = target.get("model_path")
        if not isinstance(path, str) or not path.strip():
            raise ValidationError("a disk update needs a model_path")
        return {"weight_version": version, "method": "disk", "model_path": path.strip()}
    if method == "distributed":
        group = target.get("group") or {}
        update = target.get("update") or {}
        if not isinstance(group, dict) or not isinstance(update, dict):
            raise ValidationError("distributed group and update parameters must be objects")
        return {
            "weight_version": version,
            "method": "distributed",
            "group": group,
            "update": update,
        }
    raise ValidationError(f"unknown update method {method!r}; use disk or distributed")


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
    if target["method"] == "disk":
        return Operation.UPDATE_FROM_DISK
    return Operation.UPDATE_FROM_DISTRIBUTED


def update_is_idempotent(family_name: str, target: dict[str, Any]) -> bool:
    """Whether re-running the update after an unknown outcome is safe.

    A disk reload of the same path and version lands the same weights (vLLM, SGLang). A
    distributed update depends on a trainer-side broadcast that will not be repeated.
    """
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


def _routes_of(worker: Worker) -> list[str]:
    if worker.static_worker is not None:
        return list(worker.static_worker.allowed_routes)
    return list(worker.routes or [])


def _family_of(worker: Worker, routes: list[str]) -> AdminFamily | None:
    if worker.family in FAMILIES:
        return FAMILIES[worker.family]
    return detect_family(routes)


def plan_worker(
    worker: Worker,
    *,
    target: dict[str, Any],
    pause_mode: str,
    flush_policy: str,
    verification: dict[str, Any],
    policy: OutboundPolicy,
    fingerprint: dict[str, Any] | None = None,
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
    family = _family_of(worker, routes)
    if family is None:
        blockers.append("no known admin route family in the advertised routes")
        return plan
    plan.family = family.name
    update_op = update_operation(target)
    version = target["weight_version"]

    def build(step: StepName, op: Operation, **params: Any) -> list[AdminCall]:
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

    plan.calls[StepName.PAUSE] = _serialize(build(StepName.PAUSE, Operation.PAUSE, mode=pause_mode))
    update_calls: list[AdminCall] = []
    if target["method"] == "disk":
        update_calls += build(
            StepName.UPDATE,
            update_op,
            model_path=target["model_path"],
            weight_version=version,
        )
    else:
        if target.get("group"):
            update_calls += build(StepName.UPDATE, Operation.INIT_WEIGHTS_GROUP, **target["group"])
        update_calls += build(
            StepName.UPDATE, update_op, **{**target.get("update", {}), "weight_version": version}
        )
    plan.calls[StepName.UPDATE] = _serialize(update_calls)

    invalidates = family.update_invalidates_cache(update_op)
    flush_route = family.supports(Operation.FLUSH_CACHE, routes)
    if invalidates and (flush_policy == "auto" or not flush_route):
        plan.flush_skipped = (
            f"{family.name} {update_op.value} already invalidates the prefix cache "
            "(DYNAMO_CONTRACT §4/§5)"
        )
        plan.calls[StepName.FLUSH] = []
    else:
        plan.calls[StepName.FLUSH] = _serialize(build(StepName.FLUSH, Operation.FLUSH_CACHE))

    plan.calls[StepName.RESUME_ENGINES] = _serialize(
        build(StepName.RESUME_ENGINES, Operation.RESUME)
    )

    verify: list[dict[str, Any]] = []
    if verification["version_readback"]:
        verify += _serialize(build(StepName.VERIFY, Operation.GET_WEIGHT_VERSION))
    if verification["liveness"]:
        verify += _serialize(build(StepName.VERIFY, Operation.LIVENESS))
    if verification["generation"]:
        model = verification["expected_model"] or worker.model
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
                expected_model=verification["expected_model"] or None,
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
