"""The fleet registry: which simulated workers exist, how to find them, membership changes.

All methods run on the fleet's event loop thread. Lookups are dict-based (by token and by
instance id) so a 2,000-worker fleet costs nothing per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from typing import Any

from controlplane.simfleet.collective import Collectives
from controlplane.simfleet.config import FleetConfig, WorkerSpec
from controlplane.simfleet.faults import Fault
from controlplane.simfleet.latency import LatencyConfig, LatencySampler
from controlplane.simfleet.lineage import BrokenCheckpoint, Lineage, LineageConfig
from controlplane.simfleet.workers import WORKER_CLASSES, SimWorker

#: How far automatic churn lets the worker count drift from its starting size.
CHURN_DRIFT = 2


class UnknownWorker(KeyError):
    """No live worker matches the given key."""


class SimFleet:
    """Registry of simulated workers plus membership operations and the churn loop."""

    def __init__(self, config: FleetConfig, admin_url: str) -> None:
        self.config = config
        self.admin_url = admin_url
        self.rng = random.Random(config.seed)
        self.workers: dict[str, SimWorker] = {}
        self.by_instance: dict[int, SimWorker] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=1000)
        #: Each request's `x-rl-*` headers, by server (a worker's key, or "frontend").
        self.received_headers: deque[dict[str, Any]] = deque(maxlen=20_000)
        #: Set when the fleet stops, so hung handlers wake up instead of sleeping for an hour.
        self.stopping = asyncio.Event()
        self._churn_task: asyncio.Task[None] | None = None
        self._churn_templates: list[WorkerSpec] = list(config.workers)
        self._round_robin = 0
        #: Collective weight-update groups the workers join (`collective.py`).
        self.collectives = Collectives(config.trainer_ranks)
        #: The policy lineage versions are read in, if any (`lineage.py`).
        self.lineage: Lineage | None = Lineage(config.lineage) if config.lineage else None

    # -- membership -----------------------------------------------------------------------------
    def add_worker(self, spec: WorkerSpec | dict[str, Any]) -> str:
        """Start a worker; returns its key (the token in its `system_url`)."""
        if isinstance(spec, dict):
            spec = WorkerSpec.from_dict(spec)
        instance_id = spec.instance_id
        if instance_id is None:
            # Random u64 like the runtime's ids: about half exceed 2^63.
            instance_id = self.rng.getrandbits(64)
            while instance_id in self.by_instance:
                instance_id = self.rng.getrandbits(64)
        elif instance_id in self.by_instance:
            raise ValueError(f"instance_id {instance_id} is already in use")
        token = spec.token or f"{self.rng.getrandbits(64):016x}"
        if token in self.workers:
            raise ValueError(f"worker token {token!r} is already in use")
        worker = WORKER_CLASSES[spec.family](spec, token, instance_id, self.admin_url)
        worker.fleet = self
        self._sample_latency(worker)
        self.workers[token] = worker
        self.by_instance[instance_id] = worker
        self._event("join", worker)
        return token

    def remove_worker(self, key: str | int) -> None:
        """The worker process exits: it leaves discovery and its URLs stop answering."""
        worker = self.get(key)
        self._forget(worker)
        self._event("leave", worker)

    def restart(self, key: str | int) -> int:
        """The worker process restarts: the old instance leaves discovery and a new one
        registers with a fresh instance id and the spec's base weights (what a restarted
        Dynamo worker does), on the same system port (same token). Returns the new id."""
        old = self.get(key)
        self.remove_worker(old.token)
        values = old.spec.to_dict() | {"instance_id": None, "token": old.token}
        return self.get(self.add_worker(WorkerSpec(**values))).instance_id

    def crash(self, worker: SimWorker) -> None:
        """A worker process dies mid-request (EngineDeadError, init watchdog)."""
        if worker.dead:
            return
        worker.dead = True
        worker.running.set()  # wake waiting generations so they fail instead of hanging
        self.collectives.leave(worker.token)
        self._forget(worker)
        self._event("crash", worker)

    def _forget(self, worker: SimWorker) -> None:
        self.workers.pop(worker.token, None)
        self.by_instance.pop(worker.instance_id, None)
        worker.dead = True
        worker.running.set()

    def _event(self, kind: str, worker: SimWorker) -> None:
        self.events.append(
            {
                "at": time.time(),
                "event": kind,
                "key": worker.token,
                "identity": worker.state()["identity"],
            }
        )

    # -- lookups --------------------------------------------------------------------------------
    def get(self, key: str | int) -> SimWorker:
        """Find a live worker by token, instance id (int or decimal) or identity key."""
        if isinstance(key, str):
            worker = self.workers.get(key)
            if worker is not None:
                return worker
            candidate = key.rsplit("/", 1)[-1]
            if candidate.isdigit():
                key = int(candidate)
        if isinstance(key, int) and not isinstance(key, bool):
            worker = self.by_instance.get(key)
            if worker is not None:
                return worker
        raise UnknownWorker(key)

    def routable(self, model: str | None = None) -> list[SimWorker]:
        """Workers whose generate instance is registered (optionally serving `model`)."""
        return [w for w in self.workers.values() if _serving(w, model)]

    def serves(self, model: str) -> bool:
        """`model in models()`, stopping at the first worker that serves it: every generation
        asks, and listing every worker's models for each made a 10,000-worker fleet spend a
        pass over the fleet per verify call."""
        return bool(model) and any(_serving(w, model) for w in self.workers.values())

    def models(self) -> list[str]:
        """Served model names: base models and the LoRA adapters loaded (each a model card)."""
        names = set()
        for w in self.workers.values():
            if w.routable:
                names.update({w.model} if w.model else set())
                names.update(w.serving_adapters())
        return sorted(names)

    # -- faults and state -----------------------------------------------------------------------
    def inject(self, key: str | int, route: str, fault: Fault | dict[str, Any]) -> None:
        self.get(key).faults.add(route, Fault.from_dict(fault))

    def clear_faults(self, key: str | int | None = None) -> None:
        targets = [self.get(key)] if key is not None else list(self.workers.values())
        for worker in targets:
            worker.faults.clear()

    def set_version(self, key: str | int, version: Any) -> None:
        """Operator backdoor: the worker now holds `version` (declared)."""
        self.get(key).set_version(version)

    def set_world_size(self, key: str | int, world_size: int | None) -> None:
        """The worker's topology changes (an engine restarted with other parallelism, an
        operator's `--vllm-rl-world-size`): its `rl` descriptor advertises `world_size` from
        the next probe on, under the same instance id."""
        self.get(key).spec.world_size = world_size

    def set_latency(self, key: str | int, latency: LatencyConfig | dict[str, Any] | None) -> None:
        """The worker's serving latency from now on (None: back to the fleet default)."""
        worker = self.get(key)
        worker.spec.latency = (
            None if latency is None else LatencyConfig.from_dict(latency).to_dict()
        )
        self._sample_latency(worker)

    def _sample_latency(self, worker: SimWorker) -> None:
        spec = worker.spec.latency
        config = LatencyConfig.from_dict(spec) if spec is not None else self.config.latency
        # Seeded per worker: a seeded fleet replays each worker's latencies in order.
        worker.latency = LatencySampler(config, f"{self.config.seed}:{worker.instance_id}")

    # -- the policy lineage ---------------------------------------------------------------------
    def set_lineage(self, config: LineageConfig | dict[str, Any] | None) -> None:
        """Serve versions from this lineage from now on (None: unrelated hashes again)."""
        self.config.lineage = None if config is None else LineageConfig.from_dict(config)
        self.lineage = Lineage(self.config.lineage) if self.config.lineage else None

    def set_broken(
        self, version: Any, broken: BrokenCheckpoint | str | dict[str, Any] | None
    ) -> None:
        """Mark one version of the lineage broken (or healthy again with None)."""
        if self.config.lineage is None or self.lineage is None:
            raise ValueError("the fleet serves no lineage; set one first")
        if broken is None:
            self.config.lineage.broken.pop(str(version), None)
        else:
            self.config.lineage.broken[str(version)] = BrokenCheckpoint.from_value(broken)

    def lineage_view(self) -> dict[str, Any] | None:
        return self.config.lineage.to_dict() if self.config.lineage else None

    def state(self, key: str | int) -> dict[str, Any]:
        return self.get(key).state()

    def summaries(self) -> list[dict[str, Any]]:
        return [w.summary() for w in self.workers.values()]

    # -- automatic churn ------------------------------------------------------------------------
    def start_churn(self, interval: float) -> None:
        self.stop_churn()
        self._churn_task = asyncio.get_running_loop().create_task(self._churn(interval))

    def stop_churn(self) -> None:
        if self._churn_task is not None:
            self._churn_task.cancel()
            self._churn_task = None

    @property
    def churning(self) -> bool:
        return self._churn_task is not None

    async def _churn(self, interval: float) -> None:
        """Every `interval` seconds one worker leaves or a new one joins (demo mode)."""
        baseline = len(self.workers)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), interval)
            if self.stopping.is_set():
                return
            self.churn_once(baseline)

    def churn_once(self, baseline: int) -> None:
        count = len(self.workers)
        if count >= baseline + CHURN_DRIFT:
            leave = True
        elif count <= max(1, baseline - CHURN_DRIFT):
            leave = False
        else:
            leave = self.rng.random() < 0.5
        if leave and self.workers:
            self.remove_worker(self.rng.choice(sorted(self.workers)))
        elif self._churn_templates:
            template = self._churn_templates[self._round_robin % len(self._churn_templates)]
            self._round_robin += 1
            values = template.to_dict() | {"instance_id": None, "token": None}
            self.add_worker(WorkerSpec(**values))


def _serving(worker: SimWorker, model: str | None) -> bool:
    """Routable, and serving `model` as its base model or a loaded adapter (any, when None)."""
    return worker.routable and (
        model is None or worker.model == model or model in worker.serving_adapters()
    )
