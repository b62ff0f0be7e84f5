"""What a plan verifies with: the operator's verification switches, the source's agreement rule
and the trainer's optional fingerprint, validated once at plan time and stored with the plan."""

from __future__ import annotations

from typing import Any, TypedDict, cast

from django.core.exceptions import ValidationError

from controlplane.dynamo.fingerprint import (
    AgreementRule,
    AgreementRuleJson,
    Fingerprint,
    FingerprintJson,
)
from controlplane.dynamo.generation import GenerationCheck

#: The operation name of the pinned generation in a plan's verify calls (not an admin route).
GENERATION = "generation"


class Verification(TypedDict):
    """`PolicyRefresh.verification`: the checks the verify step runs (`normalize_verification`).
    This module owns its keys."""

    #: Read the weight version back from each engine.
    version_readback: bool
    #: Ask each engine its health (and the sidecar its paused and sleeping state).
    liveness: bool
    #: Generate from `prompt_token_ids`, pinned to each worker, `max_tokens` long.
    generation: bool
    prompt_token_ids: list[int]
    max_tokens: int
    #: The model name the generation asks for ("" = each worker's own).
    expected_model: str
    #: The source's cross-worker agreement rule, copied at plan time.
    agreement: AgreementRuleJson


DEFAULT_VERIFICATION: Verification = {
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


def normalize_fingerprint(raw: Any) -> FingerprintJson | None:
    """Validate a trainer fingerprint (None or empty = none); raises ValidationError."""
    if raw is None or raw == {}:
        return None
    try:
        return Fingerprint.from_dict(raw).to_dict()
    except ValueError as exc:
        raise ValidationError(f"fingerprint: {exc}") from None


def generation_tokens(verification: Verification, fingerprint: FingerprintJson | None) -> int:
    """How many tokens the generation check asks for: enough for the agreement window and for
    every fingerprint value, never fewer than the operator asked."""
    rule = AgreementRule.from_dict(verification.get("agreement"))
    wanted = [verification["max_tokens"], rule.tokens]
    if fingerprint:
        wanted.append(Fingerprint.from_dict(fingerprint).length)
    return max(wanted)


def normalize_verification(verification: dict[str, Any] | None) -> Verification:
    merged = cast(Verification, {**DEFAULT_VERIFICATION, **(verification or {})})
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
