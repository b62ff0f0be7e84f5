"""The frontend's RL discovery listener: only `GET /v1/rl/workers` (contract §1).

Configured from a frontend-like environment dict. Every in-scope worker is probed in parallel
under one global concurrency semaphore and a per-worker deadline that includes the wait for a
permit, so a hung worker delays the whole response and, with few permits, starves healthy ones.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from controlplane.simfleet.faults import PROBE
from controlplane.simfleet.fleet import SimFleet
from controlplane.simfleet.probe import ProbeError, validate_descriptor
from controlplane.simfleet.scope import listener_scope
from controlplane.simfleet.servers.common import empty_response, json_response, pause_for
from controlplane.simfleet.workers import SimWorker

WORKERS_PATH = "/v1/rl/workers"
DEFAULT_TIMEOUT_SECS = 30
DEFAULT_MAX_PROBES = 32
_U64 = re.compile(r"[0-9]+")


class _Unlisted(Exception):
    """The worker has no visible `rl` endpoint for this call (missing-probe fault or crash)."""


def _parse_u64(raw: str | None, default: int, *, zero_ok: bool) -> int:
    # Rust `str::parse::<u64>`: no sign, no whitespace; anything else falls back to the default.
    if raw is None or not _U64.fullmatch(raw) or int(raw) >= 2**64:
        return default
    value = int(raw)
    return value if value or zero_ok else default


class ListenerSettings:
    """What the listener reads from its environment (contract §1.6)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.scope = listener_scope(env)
        self.endpoint = env.get("DYN_RL_ENDPOINT") or "rl"
        self.timeout = _parse_u64(
            env.get("DYN_RL_REQUEST_TIMEOUT_SECS"), DEFAULT_TIMEOUT_SECS, zero_ok=True
        )
        self.max_probes = _parse_u64(
            env.get("DYN_RL_MAX_CONCURRENT_PROBES"), DEFAULT_MAX_PROBES, zero_ok=False
        )
        components = {c.strip() for c in env.get("DYN_RL_COMPONENTS", "").split(",")} - {""}
        if not components:
            single = (env.get("DYN_RL_COMPONENT") or "").strip()
            components = {single} if single else set()
        self.components: frozenset[str] = frozenset(components)

    def selects(self, worker: SimWorker) -> bool:
        return (
            worker.advertised_routes is not None
            and not worker.dead
            and worker.endpoint == self.endpoint
            and self.scope.matches(worker.namespace)
            and (not self.components or worker.component in self.components)
        )


class Listener:
    """Serves the listener port."""

    def __init__(self, fleet: SimFleet, env: Mapping[str, str], transport_port: int) -> None:
        self.fleet = fleet
        self.settings = ListenerSettings(env)
        self.transport_port = transport_port
        # One semaphore shared by all concurrent `/v1/rl/workers` calls, like the real one.
        self.permits = asyncio.Semaphore(self.settings.max_probes)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path != WORKERS_PATH:
            return empty_response(404)
        if request.method not in ("GET", "HEAD"):
            return empty_response(405)
        return json_response(await self.workers_payload())

    async def workers_payload(self) -> dict[str, Any]:
        selected = [w for w in self.fleet.workers.values() if self.settings.selects(w)]
        # Dynamo starts every probe at once (join_all), each with the same per-worker timeout,
        # so one deadline per listing is what a worker waiting for a probe permit races against.
        deadline = asyncio.get_running_loop().time() + self.settings.timeout
        entries = await asyncio.gather(*(self._entry(w, deadline) for w in selected))
        listed = [e for e in entries if e is not None]
        listed.sort(key=lambda e: (e["namespace"], e["component"], e["endpoint"], e["instance_id"]))
        return {
            "protocol_version": 1,
            "namespace": self.settings.scope.reported,
            "workers": listed,
        }

    async def _entry(self, worker: SimWorker, deadline: float) -> dict[str, Any] | None:
        ns, component, endpoint = worker.namespace, worker.component, worker.endpoint
        entry: dict[str, Any] = {
            "namespace": ns,
            "component": component,
            "endpoint": endpoint,
            "instance_id": worker.instance_id,
            "transport": {
                "tcp": f"127.0.0.1:{self.transport_port}/{worker.token}/{ns}/{component}/{endpoint}"
            },
            "request_plane_url": f"dyn://{ns}.{component}.{endpoint}",
        }
        timeout = self.settings.timeout
        try:
            if timeout == 0:
                raise TimeoutError
            async with asyncio.timeout_at(deadline):
                async with self.permits:
                    # A permit freed by a probe that just timed out can be granted a moment
                    # after the shared deadline; the waiting time counted, so this one is late too.
                    if asyncio.get_running_loop().time() >= deadline:
                        raise TimeoutError
                    fields = await self._probe(worker)
            error = None
        except TimeoutError:
            fields, error = {"routes": []}, f"worker discovery timed out after {timeout}s"
        except ProbeError as exc:
            fields, error = {"routes": []}, str(exc)
        except _Unlisted:
            return None
        # Field order follows the real serde layout; absent optionals are omitted, never null.
        for name in ("system_url", "admin_base_url"):
            if name in fields:
                entry[name] = fields[name]
        if worker.model:
            entry["model"] = worker.model
        entry["routes"] = fields["routes"]
        if "world_size" in fields:
            entry["world_size"] = fields["world_size"]
        if error is not None:
            entry["error"] = error
        return entry

    async def _probe(self, worker: SimWorker) -> dict[str, Any]:
        """The request-plane `{"method":"routes"}` call, with the worker's probe faults."""
        chunk = worker.descriptor()
        for fault in worker.faults.take(PROBE, wildcard=False):
            kind = fault.kind
            if kind in ("latency", "hang"):
                await pause_for(fault.seconds, self.fleet.stopping)
            elif kind in ("probe_error", "error_body"):
                chunk = {"status": "error", "message": fault.message}
            elif kind == "body":
                chunk = fault.body
            elif kind == "http_error":
                raise ProbeError(f"Internal: RuntimeError: {fault.message}")
            elif kind == "drop":
                raise ProbeError("empty routes response from worker")
            elif kind == "missing":
                raise _Unlisted
            elif kind == "crash":
                self.fleet.crash(worker)
                raise _Unlisted
        return validate_descriptor(chunk)
