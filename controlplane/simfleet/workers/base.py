"""State and dispatch shared by every simulated worker family.

A worker is plain state plus a table of async route handlers. Handlers return a `Reply`
(HTTP status + JSON body); the system server turns it into bytes and applies faults around it.
Everything runs on the fleet's event loop, so state needs no thread locks; the per-worker
`asyncio.Lock` models the engine's own serialization (vLLM's `_pause_lock`, the sidecar mutex).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from controlplane.simfleet.collective import JoinError, wait_formed
from controlplane.simfleet.config import WorkerSpec
from controlplane.simfleet.faults import FaultBook
from controlplane.simfleet.latency import LatencyConfig, LatencySampler
from controlplane.simfleet.workers.metrics import EndpointMetrics

#: Calls kept per worker; bounded so a 2,000-worker fleet stays small in memory.
CALL_LOG_LIMIT = 200


@dataclass(frozen=True, slots=True)
class Reply:
    """What a route handler answers: HTTP status and a JSON-serializable body."""

    status: int
    body: Any


def ok(body: Any) -> Reply:
    return Reply(200, body)


def handler_error(message: str) -> Reply:
    """The system server's answer when a handler raises (HTTP 500)."""
    return Reply(500, {"error": "Handler error", "message": message})


Handler = Callable[[Any], Awaitable[Reply]]
#: `received_broadcast()` when the worker's group has not formed or got no broadcast yet.
_NO_BROADCAST: Any = object()
NO_BROADCAST = _NO_BROADCAST
#: A decoded JSON request body that a handler has checked is an object.
JsonObject = dict[str, Any]


class SimWorker:
    """One simulated worker process: identity, engine state and its admin routes."""

    family: ClassVar[str]
    #: Routes listed in the `rl` descriptor; None means the family has no `rl` endpoint.
    advertised_routes: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, spec: WorkerSpec, token: str, instance_id: int, admin_url: str) -> None:
        self.spec = spec
        self.token = token
        self.instance_id = instance_id
        self.namespace = spec.namespace
        self.component = spec.component
        self.endpoint = spec.rl_endpoint
        self.model = spec.model
        self.system_url = f"{admin_url}/w/{token}" if spec.system_server else None
        self.started_monotonic = time.monotonic()
        self.version: Any = spec.version
        self.version_declared = spec.version is not None
        #: The version held before the last change, for the silent-revert fault.
        self.previous_version: Any = spec.version
        self.paused = False
        self.pause_mode: str | None = None
        self.sleeping = False
        #: Whether the generate instance is registered in discovery (routable by the frontend).
        self.registered = True
        self.dead = False
        self.flush_count = 0
        self.cache_resets = 0
        self.update_count = 0
        self.generation_count = 0
        #: The `generate` endpoint's own counters, served on the system server's `/metrics`.
        self.generate_metrics = EndpointMetrics(spec.namespace, spec.component, instance_id)
        self.calls: deque[dict[str, Any]] = deque(maxlen=CALL_LOG_LIMIT)
        self.faults = FaultBook()
        self.lock = asyncio.Lock()
        # Set while the engine runs; generation on a paused vLLM Python worker waits on it.
        self.running = asyncio.Event()
        self.running.set()
        self.routes: dict[str, Handler] = self.build_routes()
        #: The fleet this worker runs in (set by `SimFleet.add_worker`): its collectives.
        self.fleet: Any = None
        #: Serving latency draws (the fleet replaces it with its configured default).
        self.latency = LatencySampler(LatencyConfig(), str(instance_id))

    # -- family hooks -----------------------------------------------------------------------
    def build_routes(self) -> dict[str, Handler]:
        """Route name (as served under `/engine/`) to handler."""
        raise NotImplementedError

    def descriptor(self) -> dict[str, Any] | None:
        """First data chunk of the `rl` endpoint's `routes` reply; None if there is no endpoint."""
        if self.advertised_routes is None:
            return None
        body: dict[str, Any] = {"status": "ok", "routes": sorted(self.advertised_routes)}
        if self.system_url:
            body["system_url"] = self.system_url
        if self.spec.world_size is not None:
            body["world_size"] = self.spec.world_size
        return body

    def health(self) -> Reply:
        """`/health` and `/live` of the Rust system server (Python-runtime shape)."""
        ready = self.spec.health == "ready"
        elapsed = time.monotonic() - self.started_monotonic
        state = "ready" if ready else "notready"
        body = {
            "status": state,
            "uptime": {"secs": int(elapsed), "nanos": int(elapsed % 1 * 1e9)},
            "endpoints": {"generate": "ready" if self.registered else "notready", "rl": "ready"},
        }
        return Reply(200 if ready else 503, body)

    def before_engine_call(self, route: str) -> None:
        """Side effects that happen before the engine is reached, even if the call then fails."""

    def error_reply(self, message: str) -> Reply:
        """HTTP-200 error body in this family's dialect (used by the `error_body` fault)."""
        return ok({"status": "error", "message": message})

    # -- collective weight-update groups --------------------------------------------------------
    @property
    def ranks(self) -> int:
        """How many ranks this worker holds in a group: its advertised world size."""
        return int(self.spec.world_size or 1)

    async def join_group(self, info: dict[str, Any]) -> str | None:
        """Join a collective group and wait until every rank has joined, up to the watchdog
        (`spec.init_weights_timeout`). None when formed; else the reason (`"watchdog"` when it
        expired, which each family answers in its own way)."""
        collectives = self.fleet.collectives
        try:
            group = collectives.join(self.token, info, self.ranks)
        except JoinError as exc:
            return str(exc)
        formed = await wait_formed(group, self.spec.init_weights_timeout, self.fleet.stopping)
        if not formed:
            collectives.leave(self.token)
            return "watchdog"
        return None

    def received_broadcast(self) -> Any:
        """The version the trainer broadcast to this worker's formed group, if any."""
        group = self.fleet.collectives.group_of(self.token) if self.fleet else None
        if group is None or not group.formed.is_set():
            return _NO_BROADCAST
        return group.broadcast_version if group.broadcasts else _NO_BROADCAST

    def leave_group(self) -> None:
        if self.fleet is not None:
            self.fleet.collectives.leave(self.token)

    # -- shared state transitions -------------------------------------------------------------
    def set_version(self, version: Any, *, declared: bool = True) -> None:
        if version != self.version:
            self.previous_version = self.version
        self.version = version
        self.version_declared = self.version_declared or declared

    def revert_version(self) -> None:
        """Silently fall back to the version held before the last change."""
        self.version = self.previous_version

    def unregister(self) -> None:
        self.registered = False

    def register(self) -> None:
        self.registered = True

    @property
    def routable(self) -> bool:
        return self.registered and not self.dead

    @property
    def generation_version(self) -> Any:
        """The version whose weights generation currently uses."""
        return self.version

    def serving_adapters(self) -> dict[str, str]:
        """LoRA adapter name → its source uri, for families that load adapters."""
        return {}

    def generation_version_for(self, model: str | None) -> Any:
        """What a request for `model` generates with: an adapter changes the outputs."""
        adapter = self.serving_adapters().get(model or "")
        if adapter is None:
            return self.generation_version
        return f"{self.generation_version}+lora:{model}@{adapter}"

    def generation_problem(self) -> str | None:
        """Why this worker cannot generate right now (released memory), or None."""
        return None

    def log_call(
        self, route: str, method: str, body: Any, reply: Reply | None, note: str = ""
    ) -> None:
        self.calls.append(
            {
                "at": time.time(),
                "route": route,
                "method": method,
                "body": body,
                "status": reply.status if reply else None,
                "reply": reply.body if reply else None,
                "note": note,
            }
        )

    def state(self) -> dict[str, Any]:
        """JSON view used by the control API and the in-process handle."""
        return {
            "key": self.token,
            "family": self.family,
            "namespace": self.namespace,
            "component": self.component,
            "endpoint": self.endpoint,
            "instance_id": self.instance_id,
            "identity": f"{self.namespace}/{self.component}/{self.endpoint}/{self.instance_id}",
            "model": self.model,
            "system_url": self.system_url,
            "version": self.version,
            "version_declared": self.version_declared,
            "paused": self.paused,
            "pause_mode": self.pause_mode,
            "sleeping": self.sleeping,
            "registered": self.registered,
            "dead": self.dead,
            "flush_count": self.flush_count,
            "cache_resets": self.cache_resets,
            "update_count": self.update_count,
            "generation_count": self.generation_count,
            "latency": self.latency.config.to_dict(),
            "faults": self.faults.to_dict(),
            "calls": list(self.calls),
        }

    def summary(self) -> dict[str, Any]:
        """The short form listed by `workers()`."""
        state = self.state()
        del state["calls"], state["faults"]
        return state
