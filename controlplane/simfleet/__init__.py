"""A faithful simulated NVIDIA Dynamo 1.6.1 RL deployment with fault injection.

One process serves an RL discovery listener (`GET /v1/rl/workers`), every worker's system
server (multiplexed by path on one admin port), an OpenAI frontend and a `/_sim/` control API.
The core modules import nothing from Django.

    with run_fleet(workers=4, namespaces=["rl-a", "rl-b"], prefix="rl") as fleet:
        fleet.inject(key, "pause_generation", Fault.http(503, once=True))
"""

from controlplane.simfleet.client import SimFleetControl, SimFleetError
from controlplane.simfleet.config import (
    FAMILY_SGLANG,
    FAMILY_SIDECAR,
    FAMILY_VLLM,
    FleetConfig,
    WorkerSpec,
)
from controlplane.simfleet.faults import Fault
from controlplane.simfleet.runtime import FleetHandle, SimFleetServer, run_fleet
from controlplane.simfleet.tokens import expected_completion_ids
from controlplane.simfleet.workers import SIDECAR_ROUTES, VLLM_RL_ROUTES

__all__ = [
    "FAMILY_SGLANG",
    "FAMILY_SIDECAR",
    "FAMILY_VLLM",
    "SIDECAR_ROUTES",
    "VLLM_RL_ROUTES",
    "Fault",
    "FleetConfig",
    "FleetHandle",
    "SimFleetControl",
    "SimFleetError",
    "SimFleetServer",
    "WorkerSpec",
    "expected_completion_ids",
    "run_fleet",
]
