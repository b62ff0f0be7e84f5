"""The network half of a discovery refresh: listener, then version and liveness probes.

Runs on one event loop with one client, so thousands of probes share a connection pool; a
semaphore bounds how many are in flight and every call has its own timeout. Nothing here
touches the database: the caller passes plain data in and gets plain data out.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any

from controlplane.dynamo.admin import PreparedCall, ReplyCache, call_admin
from controlplane.dynamo.discovery import (
    DiscoveredWorker,
    DiscoveryResult,
    fetch_discovery,
    worker_key,
)
from controlplane.dynamo.families import FAMILIES, AdminFamily, Operation, detect_family
from controlplane.dynamo.http import DynamoClient, make_client
from controlplane.dynamo.limits import storable_text, weight_version_problem
from controlplane.dynamo.policy import OutboundPolicy

#: Endpoint name given to static workers, which have no discovery endpoint of their own.
STATIC_ENDPOINT = "static"


@dataclass(frozen=True, slots=True)
class StaticSpec:
    """A static worker as the refresh needs it (no ORM objects cross into the event loop)."""

    pk: int
    name: str
    namespace: str
    component: str
    system_url: str
    family: str
    allowed_routes: tuple[str, ...]
    model: str


@dataclass(slots=True)
class Observation:
    """Everything one refresh learned about one worker."""

    namespace: str
    component: str
    endpoint: str
    instance_id: str
    family: str = ""
    transport: dict[str, Any] = field(default_factory=dict)
    request_plane_url: str = ""
    system_url: str = ""
    admin_base_url: str = ""
    model: str = ""
    routes: tuple[str, ...] = ()
    world_size: int | None = None
    error: str = ""
    static_worker_id: int | None = None
    version_probed: bool = False
    version_ok: bool = False
    weight_version: Any = None
    weight_version_declared: bool = False
    version_error: str = ""
    liveness: str = "unknown"
    liveness_error: str = ""

    @property
    def key(self) -> str:
        return worker_key(self.namespace, self.component, self.endpoint, self.instance_id)


@dataclass(slots=True)
class ObservedFleet:
    result: DiscoveryResult
    workers: list[Observation]
    requests: int = 0


def static_instance_id(source_id: int, name: str) -> str:
    """A stable u64 per (source, static worker name), so the row keeps its history."""
    digest = hashlib.blake2b(f"{source_id}/{name}".encode(), digest_size=8).digest()
    return str(int.from_bytes(digest, "big"))


def _from_discovered(worker: DiscoveredWorker) -> Observation:
    ident = worker.identity
    family = detect_family(worker.routes)
    return Observation(
        namespace=ident.namespace,
        component=ident.component,
        endpoint=ident.endpoint,
        instance_id=str(ident.instance_id),
        family=family.name if family else "",
        transport=worker.transport,
        request_plane_url=worker.request_plane_url,
        system_url=worker.system_url or "",
        admin_base_url=worker.admin_base_url or "",
        model=worker.model or "",
        routes=worker.routes,
        world_size=worker.world_size,
        error=worker.error or "",
    )


def _from_static(source_id: int, spec: StaticSpec) -> Observation:
    return Observation(
        namespace=spec.namespace,
        component=spec.component,
        endpoint=STATIC_ENDPOINT,
        instance_id=static_instance_id(source_id, spec.name),
        family=spec.family,
        system_url=spec.system_url,
        model=spec.model,
        routes=spec.allowed_routes,
        static_worker_id=spec.pk,
    )


class Prober:
    """Version and liveness probes for many workers, bounded and timed out per call.

    One client (one aiohttp connection pool) and one semaphore: at most `concurrency` calls
    are in flight, whatever the number of workers. What does not depend on the worker is done
    once per refresh: each family's probe calls are built and encoded once, the outbound
    policy judges each worker's `system_url` once (the probe's own check and both calls share
    the verdict, see `OutboundPolicy.admin_violation`; `policy` should be made `for_run`), and
    identical replies (`{"status": "ok"}` two thousand times) are decoded once.
    """

    def __init__(
        self, client: DynamoClient, policy: OutboundPolicy, *, timeout: float, concurrency: int
    ) -> None:
        self.client = client
        self.permits = asyncio.Semaphore(concurrency)
        self.policy = policy
        self.timeout = timeout
        self.requests = 0
        self.replies = ReplyCache()
        self._calls: dict[tuple[str, Operation], PreparedCall] = {}

    def _prepared(self, family: AdminFamily, op: Operation) -> PreparedCall:
        prepared = self._calls.get((family.name, op))
        if prepared is None:
            (call,) = family.build(op)
            prepared = self._calls[family.name, op] = PreparedCall.of(call)
        return prepared

    async def _call(self, obs: Observation, family: AdminFamily, op: Operation):
        call = self._prepared(family, op)
        async with self.permits:
            self.requests += 1
            return await call_admin(
                self.client,
                self.policy,
                obs.system_url,
                family,
                call,
                timeout=self.timeout,
                replies=self.replies,
            )

    async def probe(self, obs: Observation) -> None:
        if obs.error or not obs.system_url:
            return
        # The system_url comes from whatever the worker advertised: a URL outside the source's
        # networks makes the worker erroring and is never called.
        problem = await self.policy.admin_violation(obs.system_url)
        if problem is not None:
            obs.error = f"system_url outside allowed networks: {problem}"
            return
        family = FAMILIES.get(obs.family)
        if family is None:
            return
        ops = [
            op
            for op in (Operation.GET_WEIGHT_VERSION, Operation.LIVENESS)
            if family.supports(op, obs.routes)
        ]
        if len(ops) == 2:
            # Both probes in flight at once, with one extra task rather than gather's two
            # (plus its bookkeeping): at 2,000 workers the task overhead is measurable.
            first = asyncio.ensure_future(self._call(obs, family, ops[0]))
            try:
                second = await self._call(obs, family, ops[1])
            except BaseException:
                first.cancel()
                raise
            results = [await first, second]
        else:
            results = [await self._call(obs, family, op) for op in ops]
        for op, result in zip(ops, results, strict=True):
            if op == Operation.GET_WEIGHT_VERSION:
                _record_version(obs, result.ok, result.data, result.error)
            else:
                obs.liveness = "alive" if result.ok else "dead"
                obs.liveness_error = (
                    "" if result.ok else storable_text(result.error or "liveness failed")
                )


def _record_version(obs: Observation, ok: bool, data: dict[str, Any] | None, error: str | None):
    """A version reply flows into the database: one we cannot store (NUL, NaN, too long) is a
    probe error for this worker, like an unreadable reply, never a failed refresh."""
    obs.version_probed = True
    if ok:
        data = data or {}
        version = data.get("version")
        if problem := weight_version_problem(version):
            ok, error = False, problem
        else:
            obs.weight_version = version
            obs.weight_version_declared = bool(data.get("version_declared"))
    obs.version_ok = ok
    if not ok:
        obs.version_error = storable_text(error or "version probe failed")


async def observe(
    *,
    source_id: int,
    listener_url: str,
    policy: OutboundPolicy,
    statics: list[StaticSpec],
    listener_timeout: float,
    probe_timeout: float,
    concurrency: int,
) -> ObservedFleet:
    """Fetch discovery and probe every worker. Raises DiscoveryError for listener problems."""
    policy = policy.for_run()
    async with make_client(
        timeout=max(listener_timeout, probe_timeout), max_connections=concurrency
    ) as client:
        result = await fetch_discovery(client, policy, listener_url, timeout=listener_timeout)
        workers = [_from_discovered(w) for w in result.workers]
        workers += [_from_static(source_id, s) for s in statics]
        prober = Prober(client, policy, timeout=probe_timeout, concurrency=concurrency)
        await asyncio.gather(*(prober.probe(obs) for obs in workers))
    return ObservedFleet(result, workers, prober.requests + 1)
