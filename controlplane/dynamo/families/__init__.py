"""Admin route families: one adapter per backend dialect, chosen from advertised routes."""

from __future__ import annotations

from collections.abc import Iterable

from .base import (
    AdminCall,
    AdminFamily,
    AdminOutcome,
    Operation,
    UnsupportedOperation,
    custom_call,
)
from .methods import LoraAction, Negotiation, UpdateMethod, negotiate, offered_methods
from .sglang import SGLANG
from .vllm import VLLM_WORKER
from .vllm_sidecar import VLLM_SIDECAR

FAMILIES: dict[str, AdminFamily] = {f.name: f for f in (VLLM_WORKER, VLLM_SIDECAR, SGLANG)}

# Route names unique to one dialect. `update/model_taints` is advertised by several families
# (and alone by a sidecar without RL capabilities), so it identifies nothing.
_SIDECAR_MARKERS = frozenset(
    {
        "control/pause_generation",
        "control/resume_generation",
        "control/get_weight_version",
        "control/is_paused",
        "update/start_weight_update",
        "update/finish_weight_update",
        "update/update_weights",
        "update/init_weight_transfer_engine",
        "update/update_weight_version",
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


def detect_family(routes: Iterable[str]) -> AdminFamily | None:
    """Pick the dialect from advertised route names; None when nothing is recognisable.

    Sidecar first (its `control/pause_generation` is unique), then SGLang (`continue_generation`
    and `control/update_*` never appear on vLLM), then the Python vLLM worker's bare names.
    """
    names = frozenset(routes)
    if names & _SIDECAR_MARKERS:
        return VLLM_SIDECAR
    if names & _SGLANG_MARKERS:
        return SGLANG
    if names & _VLLM_MARKERS:
        return VLLM_WORKER
    return None


__all__ = [
    "FAMILIES",
    "SGLANG",
    "VLLM_SIDECAR",
    "VLLM_WORKER",
    "AdminCall",
    "AdminFamily",
    "AdminOutcome",
    "LoraAction",
    "Negotiation",
    "Operation",
    "UnsupportedOperation",
    "UpdateMethod",
    "custom_call",
    "detect_family",
    "negotiate",
    "offered_methods",
]
