"""A faithful simulated NVIDIA Dynamo 1.6.1 RL deployment with fault injection.

One process serves an RL discovery listener (`GET /v1/rl/workers`), every worker's system
server (multiplexed by path on one admin port), an OpenAI frontend and a `/_sim/` control API.
The core modules import nothing from Django.

    with run_fleet(workers=4, namespaces=["rl-a", "rl-b"], prefix="rl") as fleet:
        fleet.inject(key, "pause_generation", Fault.http(503, once=True))

With `FleetConfig(lineage={"seed": 1, "broken": {"v9": "drift"}})` versions are steps of one
policy lineage (`lineage.py`); the frontend serves prompt logprobs, per-worker latency
(`latency.py`) and Prometheus `/metrics` under the real frontend's names.
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
from controlplane.simfleet.latency import LatencyConfig, LatencyDistribution
from controlplane.simfleet.lineage import (
    BROKEN_KINDS,
    BrokenCheckpoint,
    Lineage,
    LineageConfig,
)
from controlplane.simfleet.runtime import FleetHandle, SimFleetServer, run_fleet
from controlplane.simfleet.tokens import expected_completion_ids
from controlplane.simfleet.workers import SIDECAR_ROUTES, VLLM_RL_ROUTES

__all__ = [
    "BROKEN_KINDS",
    "FAMILY_SGLANG",
    "FAMILY_SIDECAR",
    "FAMILY_VLLM",
    "SIDECAR_ROUTES",
    "VLLM_RL_ROUTES",
    "BrokenCheckpoint",
    "Fault",
    "FleetConfig",
    "FleetHandle",
    "LatencyConfig",
    "LatencyDistribution",
    "Lineage",
    "LineageConfig",
    "SimFleetControl",
    "SimFleetError",
    "SimFleetServer",
    "WorkerSpec",
    "expected_completion_ids",
    "run_fleet",
]
