"""Simulated worker families: vLLM Python worker, native vLLM sidecar, SGLang."""

from controlplane.simfleet.config import FAMILY_SGLANG, FAMILY_SIDECAR, FAMILY_VLLM
from controlplane.simfleet.workers.base import Reply, SimWorker
from controlplane.simfleet.workers.sglang import SglangWorker
from controlplane.simfleet.workers.sidecar import SIDECAR_ROUTES, SidecarWorker
from controlplane.simfleet.workers.vllm import VLLM_RL_ROUTES, VllmWorker

WORKER_CLASSES: dict[str, type[SimWorker]] = {
    FAMILY_VLLM: VllmWorker,
    FAMILY_SIDECAR: SidecarWorker,
    FAMILY_SGLANG: SglangWorker,
}

__all__ = [
    "SIDECAR_ROUTES",
    "VLLM_RL_ROUTES",
    "WORKER_CLASSES",
    "Reply",
    "SglangWorker",
    "SidecarWorker",
    "SimWorker",
    "VllmWorker",
]
