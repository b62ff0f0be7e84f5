"""Configuration of a simulated fleet: worker specs, listener environment, ports.

A `FleetConfig` is plain data so it can come from Python (tests), a JSON file (the demo) or the
command line (`simfleet --workers 12 --namespaces rl-a,rl-b --prefix rl`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final, Literal

from controlplane.simfleet.latency import LatencyConfig
from controlplane.simfleet.lineage import LineageConfig

#: Backend families a simulated worker can speak (names match `controlplane.dynamo.families`).
FAMILY_VLLM: Final = "vllm"
FAMILY_SIDECAR = "vllm-sidecar"
FAMILY_SGLANG = "sglang"
FAMILIES = (FAMILY_VLLM, FAMILY_SIDECAR, FAMILY_SGLANG)

Family = Literal["vllm", "vllm-sidecar", "sglang"]

DEFAULT_MODEL = "sim-model"
#: The Dynamo releases a simulated worker can behave as (`controlplane.dynamo.releases`).
RELEASES = ("1.6.1", "1.7")


@dataclass
class WorkerSpec:
    """What one simulated worker process looks like from the outside.

    `instance_id` and `token` are drawn from the fleet's random generator when omitted; the
    token is the path segment that separates this worker's system server from the others on
    the shared admin port (`system_url = {admin_url}/w/{token}`).
    """

    namespace: str = "dynamo"
    component: str = "backend"
    family: Family = FAMILY_VLLM
    #: Display name of the model card; None registers no card (the listener omits `model`).
    model: str | None = DEFAULT_MODEL
    world_size: int | None = 1
    instance_id: int | None = None
    token: str | None = None
    #: Initial weight version. None means "never declared" for vLLM Python workers.
    version: Any = None
    #: RL endpoint name; Python workers hard-code `rl`, native sidecars honour `DYN_RL_ENDPOINT`.
    rl_endpoint: str = "rl"
    #: Sidecar only: the backend-native HTTP base URL advertised as `admin_base_url`.
    admin_base_url: str | None = None
    #: False simulates a worker started without `DYN_SYSTEM_PORT` (no `system_url` advertised).
    system_server: bool = True
    #: `/health` status: real Python workers stay `notready` unless endpoint health is enabled.
    health: Literal["ready", "notready"] = "ready"
    #: vLLM `DYN_RL_INIT_WEIGHTS_TIMEOUT_S`: a longer init-group hang kills the worker.
    init_weights_timeout: float = 30.0
    #: SGLang only: configured `--engine-route` paths (`path[=method][:engine|tm]`) whose
    #: method the simulator knows (`flush_cache`, `get_weight_version`, group init/destroy).
    engine_routes: list[str] = field(default_factory=list)
    #: vLLM only: `--enable-lora` with this many adapter slots (`load_lora`/`unload_lora`
    #: registered and advertised); None = LoRA disabled.
    lora_capacity: int | None = None
    #: vLLM only: `DYN_LORA_HOTSWAP_ENABLED=true` (a load of a loaded name replaces it).
    lora_hotswap: bool = False
    #: SGLang only: requests in flight that a `retract`/`in_place` pause holds; a disk update
    #: reports them as `num_paused_requests` and drops them when `abort_all_requests` is true.
    paused_requests: int = 0
    #: The Dynamo release this worker behaves as. 1.7 (DYNAMO_CONTRACT §9): the vLLM sidecar
    #: refuses generation requests carrying `sampling_params.extra_args`; SGLang's disk update
    #: continues generation afterwards unless `keep_pause` is true.
    dynamo_release: str = "1.6.1"
    #: vLLM only: False simulates a build that does not track declared versions: no
    #: `set_weight_version` route, and `get_weight_version` answers without `version_declared`.
    version_tracking: bool = True
    #: This worker's serving latency (`LatencyConfig` as JSON); None uses the fleet's.
    latency: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.latency is not None:
            # Validate now, keep JSON: specs are copied through `to_dict` (restart, churn).
            self.latency = LatencyConfig.from_dict(self.latency).to_dict()
        if self.family not in FAMILIES:
            raise ValueError(f"unknown worker family {self.family!r}; expected one of {FAMILIES}")
        if self.dynamo_release not in RELEASES:
            raise ValueError(
                f"unknown Dynamo release {self.dynamo_release!r}; expected one of {RELEASES}"
            )
        if self.instance_id is not None and not 0 <= int(self.instance_id) < 2**64:
            raise ValueError("instance_id must be an unsigned 64-bit integer")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerSpec:
        """Build a spec from JSON, rejecting unknown keys so typos in config files surface."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown worker spec keys: {sorted(unknown)}")
        values = dict(data)
        if values.get("instance_id") is not None:
            values["instance_id"] = int(values["instance_id"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FleetConfig:
    """Everything needed to start one simulated Dynamo deployment."""

    workers: list[WorkerSpec] = field(default_factory=list)
    #: The frontend's environment as seen by the RL listener (`DYN_NAMESPACE`, `DYN_RL_*`, ...).
    listener_env: dict[str, str] = field(default_factory=dict)
    #: Bind address. Loopback by default; a container deployment binds 0.0.0.0 and sets
    #: `advertise_host` to the name other containers reach it by.
    host: str = "127.0.0.1"
    advertise_host: str | None = None
    listener_port: int = 0
    frontend_port: int = 0
    admin_port: int = 0
    #: Seed for instance ids, tokens and churn; None draws fresh randomness.
    seed: int | None = None
    #: Automatic membership churn period in seconds (demo mode); None disables it.
    churn_interval: float | None = None
    #: How long a generation request waits on a paused vLLM Python worker before giving up.
    paused_generation_max_wait: float = 30.0
    #: Ranks the stand-in trainer holds in every collective weight-update group (0..n-1).
    trainer_ranks: int = 1
    #: The policy lineage versions are read in (`lineage.py`); None keeps every version's
    #: output an unrelated hash of (version, prompt), as `expected_completion_ids` computes.
    lineage: LineageConfig | None = None
    #: Default serving latency of every worker (`latency.py`); a spec may override it.
    latency: LatencyConfig = field(default_factory=LatencyConfig)

    def __post_init__(self) -> None:
        if isinstance(self.lineage, dict):
            self.lineage = LineageConfig.from_dict(self.lineage)
        if isinstance(self.latency, dict):
            self.latency = LatencyConfig.from_dict(self.latency)

    @classmethod
    def generate(
        cls,
        workers: int = 4,
        namespaces: list[str] | tuple[str, ...] = ("dynamo",),
        prefix: str | None = None,
        family: Family = FAMILY_VLLM,
        model: str = DEFAULT_MODEL,
        **kwargs: Any,
    ) -> FleetConfig:
        """A fleet of `workers` identical workers spread round-robin over `namespaces`.

        With `prefix` the listener runs in prefix mode; otherwise, with one namespace, it is
        scoped exactly to it, and with several it runs global so all of them are listed.
        """
        specs = [
            WorkerSpec(namespace=namespaces[i % len(namespaces)], family=family, model=model)
            for i in range(workers)
        ]
        env = dict(kwargs.pop("listener_env", {}))
        if prefix:
            env.setdefault("DYN_NAMESPACE_PREFIX", prefix)
        elif len(set(namespaces)) == 1:
            env.setdefault("DYN_NAMESPACE", namespaces[0])
        else:
            env.setdefault("DYN_NAMESPACE_PREFIX", "dynamo")
        return cls(workers=specs, listener_env=env, **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetConfig:
        """Parse a JSON config. A worker entry may carry `count` to repeat itself."""
        values = dict(data)
        specs: list[WorkerSpec] = []
        for entry in values.pop("workers", []):
            entry = dict(entry)
            count = int(entry.pop("count", 1))
            specs.extend(WorkerSpec.from_dict(entry) for _ in range(count))
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown fleet config keys: {sorted(unknown)}")
        env = values.pop("listener_env", {})
        return cls(workers=specs, listener_env={str(k): str(v) for k, v in env.items()}, **values)

    @classmethod
    def from_file(cls, path: str | Path) -> FleetConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
