"""Admin route families: one adapter per backend dialect, chosen from advertised routes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..releases import DEFAULT_RELEASE, contract
from .base import (
    AdminCall,
    AdminFamily,
    AdminOutcome,
    Operation,
    UnsupportedOperation,
    custom_call,
)
from .methods import LoraAction, Negotiation, UpdateMethod, negotiate, offered_methods
from .sglang import SGLANG, SglangFamily
from .vllm import VLLM_WORKER, VllmWorkerFamily
from .vllm_sidecar import VLLM_SIDECAR, VllmSidecarFamily

#: The adapters of the default release (1.6.1); `for_release` gives another release's.
FAMILIES: dict[str, AdminFamily] = {f.name: f for f in (VLLM_WORKER, VLLM_SIDECAR, SGLANG)}
_BY_RELEASE: dict[str, dict[str, AdminFamily]] = {DEFAULT_RELEASE: FAMILIES}


def for_release(name: str, release: str = "") -> AdminFamily:
    """The `name` adapter built from `release`'s contract (`dynamo.releases`: route tables,
    bodies, success rules); blank = the default release. KeyError for an unknown family,
    ValueError for an unknown release."""
    found = contract(release)
    families = _BY_RELEASE.get(found.name)
    if families is None:
        built = (VllmWorkerFamily(found), VllmSidecarFamily(found), SglangFamily(release=found))
        families = _BY_RELEASE.setdefault(found.name, {f.name: f for f in built})
    return families[name]


# Route names unique to one dialect. `update/model_taints` is advertised by several families
# (and alone by a sidecar without RL capabilities), so it identifies nothing.
#
# Native Rust sidecars (vLLM, SGLang, TRT-LLM) all advertise the `control/*` + `update/*`
# dialect: `control/pause_generation`, `control/resume_generation`, `control/get_weight_version`,
# `update/update_weight_version` say "a native sidecar", not which engine is behind it. Only
# the names of vLLM's own weight-transfer API (`init_weight_transfer_engine`, `start_weight_update`,
# `update_weights`, `finish_weight_update`, the RPCs of vLLM's gRPC `Control` service) say vLLM.
_VLLM_SIDECAR_MARKERS = frozenset(
    {
        "update/init_weight_transfer_engine",
        "update/start_weight_update",
        "update/update_weights",
        "update/finish_weight_update",
    }
)
_SGLANG_MARKERS = frozenset(
    {
        "continue_generation",
        "control/update_weights_from_disk",
        "control/update_weights_from_distributed",
        "control/update_weight_version",
    }
)
_VLLM_MARKERS = frozenset(
    {
        "pause_generation",
        "resume_generation",
        "liveness_probe",
        "get_weight_version",
        "set_weight_version",
        "update_weights_from_disk",
        "update_weights_from_distributed",
        "flush_cache",
    }
)
_NATIVE_PREFIXES = ("control/", "update/")

#: What an operator may declare for a source or namespace. The native SGLang and TRT-LLM
#: sidecars are declarable so that a declaration can refuse them by name: no adapter drives
#: them (their routes share the vLLM sidecar's names, their bodies do not).
DECLARABLE_FAMILIES = ("vllm", "vllm-sidecar", "sglang", "sglang-sidecar", "trtllm-sidecar")
_WITHOUT_ADAPTER = {"sglang-sidecar": "SGLang", "trtllm-sidecar": "TRT-LLM"}


def _native(names: frozenset[str]) -> bool:
    return any(n.startswith(_NATIVE_PREFIXES) for n in names if n != "update/model_taints")


def detect_family(routes: Iterable[str]) -> AdminFamily | None:
    """Pick the dialect from advertised route names; None when the names do not say.

    vLLM's sidecar only on vLLM's weight-transfer names (a bare native route set is
    ambiguous, see `family_verdict`), then SGLang (`continue_generation` and `control/update_*`
    never appear on vLLM), then the Python vLLM worker's bare names.
    """
    names = frozenset(routes)
    if names & _VLLM_SIDECAR_MARKERS:
        return VLLM_SIDECAR
    if names & _SGLANG_MARKERS:
        return SGLANG
    if _native(names):
        return None
    if names & _VLLM_MARKERS:
        return VLLM_WORKER
    return None


@dataclass(frozen=True)
class FamilyVerdict:
    """The family to drive a worker with, or why none may be (`reason`, naming it)."""

    family: AdminFamily | None
    reason: str = ""
    #: Where the family comes from: "routes", "declared", or "" when refused.
    evidence: str = ""


def family_verdict(routes: Iterable[str], declared: str = "") -> FamilyVerdict:
    """The family from evidence: the route names where they identify the engine, an operator's
    declaration (per source or namespace) where they do not. A declaration never overrides
    routes that say otherwise; an ambiguous worker is refused, so nothing mutating is sent."""
    names = frozenset(routes)
    detected = detect_family(names)
    if declared:
        if declared in _WITHOUT_ADAPTER:
            return FamilyVerdict(
                None,
                f"declared family {declared}: there is no adapter for the native "
                f"{_WITHOUT_ADAPTER[declared]} sidecar, so it is never paused or updated",
            )
        family = FAMILIES.get(declared)
        if family is None:
            return FamilyVerdict(None, f"declared family {declared!r} is unknown")
        if detected is not None and detected is not family:
            return FamilyVerdict(
                None,
                f"declared family {declared} contradicts the advertised routes, which are "
                f"{detected.name}'s",
            )
        if detected is None and _native(names) != (family is VLLM_SIDECAR):
            return FamilyVerdict(
                None,
                f"declared family {declared} does not advertise "
                + ("control/* and update/* routes" if family is VLLM_SIDECAR else "these routes"),
            )
        return FamilyVerdict(family, evidence="declared" if detected is None else "routes")
    if detected is not None:
        return FamilyVerdict(detected, evidence="routes")
    if _native(names):
        return FamilyVerdict(
            None,
            "ambiguous family: only native sidecar routes (control/*, update/*), which the vLLM, "
            "SGLang and TRT-LLM sidecars all advertise; declare the family on the source or "
            "namespace",
        )
    return FamilyVerdict(None, "no known admin route family in the advertised routes")


def routes_fit(routes: Iterable[str], family_name: str) -> bool:
    """Whether a worker advertising `routes` can still be the `family_name` worker it was
    planned as (a re-read of the listing during a refresh)."""
    family = FAMILIES.get(family_name)
    if family is None:
        return False
    detected = detect_family(routes)
    if detected is not None:
        return detected is family
    return family is VLLM_SIDECAR and _native(frozenset(routes))


__all__ = [
    "DECLARABLE_FAMILIES",
    "FAMILIES",
    "SGLANG",
    "VLLM_SIDECAR",
    "VLLM_WORKER",
    "AdminCall",
    "AdminFamily",
    "AdminOutcome",
    "FamilyVerdict",
    "LoraAction",
    "Negotiation",
    "Operation",
    "UnsupportedOperation",
    "UpdateMethod",
    "custom_call",
    "detect_family",
    "family_verdict",
    "for_release",
    "negotiate",
    "offered_methods",
    "routes_fit",
]
