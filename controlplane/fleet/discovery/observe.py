"""The network half of a discovery refresh: listener, then version and liveness probes.

Runs on one event loop with one client, so thousands of probes share a connection pool; a
semaphore bounds how many are in flight and every call has its own timeout. Nothing here
touches the database: the caller passes plain data in and gets plain data out.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from controlplane.dynamo.admin import (
    CACHED_REPLY_BYTES,
    PreparedCall,
    ReplyCache,
    admin_url,
    transport_failure,
)
from controlplane.dynamo.discovery import (
    DiscoveredWorker,
    DiscoveryResult,
    fetch_discovery,
    worker_key,
)
from controlplane.dynamo.errors import TransportError, one_line
from controlplane.dynamo.families import (
    FAMILIES,
    AdminFamily,
    Operation,
    detect_family,
    for_release,
)
from controlplane.dynamo.frontend_health import (
    FrontendHealthError,
    FrontendInstances,
    Identity,
    fetch_frontend_instances,
    resolve_identity,
)
from controlplane.dynamo.http import MAX_RESPONSE_BYTES, DynamoClient, make_client
from controlplane.dynamo.limits import storable_text, weight_version_problem
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet.declared_scope import DeclaredScope

#: The endpoint text of a static worker whose real identity is unknown or refused: its row is
#: keyed `namespace/component/static:<name>/` with an empty instance id, never an invented one.
UNIDENTIFIED_ENDPOINT = "static:{name}"


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
    endpoint: str = "generate"
    declared_instance_id: str = ""


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
    #: Static workers: why the real instance id is unknown ("" when resolved).
    identity_note: str = ""

    @property
    def key(self) -> str:
        return worker_key(self.namespace, self.component, self.endpoint, self.instance_id)


@dataclass(slots=True, repr=False)
class ObservedFleet:
    result: DiscoveryResult
    workers: list[Observation]
    requests: int = 0

    def __repr__(self) -> str:
        # Short on purpose: `asyncio.run` in a main thread formats the finished task, result
        # included, when it restores the SIGINT handler (signal.getsignal builds a ValueError
        # text with its repr), and a full repr of 2,000 workers costs more than their parse.
        return f"<ObservedFleet {len(self.workers)} workers, {self.requests} requests>"


def _from_discovered(worker: DiscoveredWorker, families: dict[tuple[str, ...], str]) -> Observation:
    """`families`: the family name per distinct route set, detected once per refresh."""
    ident = worker.identity
    family = families.get(worker.routes)
    if family is None:
        detected = detect_family(worker.routes)
        family = families[worker.routes] = detected.name if detected else ""
    return Observation(
        namespace=ident.namespace,
        component=ident.component,
        endpoint=ident.endpoint,
        instance_id=str(ident.instance_id),
        family=family,
        transport=worker.transport,
        request_plane_url=worker.request_plane_url,
        system_url=worker.system_url or "",
        admin_base_url=worker.admin_base_url or "",
        model=worker.model or "",
        routes=worker.routes,
        world_size=worker.world_size,
        error=worker.error or "",
    )


def _from_static(spec: StaticSpec, identity: Identity) -> Observation:
    """A static worker under its real identity, or unidentified (empty id, with why)."""
    obs = Observation(
        namespace=spec.namespace,
        component=spec.component,
        endpoint=UNIDENTIFIED_ENDPOINT.format(name=spec.name),
        instance_id="",
        family=spec.family,
        system_url=spec.system_url,
        model=spec.model,
        routes=spec.allowed_routes,
        static_worker_id=spec.pk,
        error=identity.refusal,
        identity_note=identity.note,
    )
    if identity.instance is not None:
        obs.endpoint = identity.instance.endpoint
        obs.instance_id = str(identity.instance.instance_id)
        obs.transport = identity.instance.transport
    return obs


async def _static_identities(
    client: DynamoClient,
    policy: OutboundPolicy,
    frontend_url: str,
    statics: list[StaticSpec],
    timeout: float,
) -> list[Identity]:
    """Resolve every static worker against one fresh read of the frontend's `/health`."""
    listing: FrontendInstances | None = None
    unavailable = ""
    if statics and frontend_url:
        try:
            listing = await fetch_frontend_instances(client, policy, frontend_url, timeout=timeout)
        except FrontendHealthError as exc:
            unavailable = exc.reason
    return [
        resolve_identity(
            name=s.name,
            namespace=s.namespace,
            component=s.component,
            endpoint=s.endpoint,
            system_url=s.system_url,
            declared_id=s.declared_instance_id,
            listing=listing,
            unavailable=unavailable,
        )
        for s in statics
    ]


def _refuse_out_of_scope(workers: list[Observation], scope: DeclaredScope, reported: str) -> None:
    """Mark every listed worker outside the declared scope erroring, with why (never probed,
    never planned). Verdicts are per namespace, so a fleet costs one check per namespace."""
    verdicts: dict[str, str] = {}
    for obs in workers:
        verdict = verdicts.get(obs.namespace)
        if verdict is None:
            verdict = verdicts[obs.namespace] = scope.refusal(obs.namespace, reported)
        if verdict:
            obs.error = f"{verdict}; {obs.error}" if obs.error else verdict


#: What one probe reply means for a worker: `(version_ok, version, declared, version_error)`
#: for the version probe, `(liveness, liveness_error)` for the liveness probe.
Reading = tuple[Any, ...]
#: Distinct (family, operation, status, body) readings one refresh remembers.
READINGS_LIMIT = 1024


class Prober:
    """Version and liveness probes for many workers, bounded and timed out per call.

    One client (one aiohttp connection pool) and one semaphore: at most `concurrency` calls
    are in flight, whatever the number of workers; every call has its own deadline. What does
    not depend on the worker is done once per refresh: each family's probe calls are built and
    encoded once, the outbound policy judges each worker's `system_url` once (both calls
    share the verdict, see `OutboundPolicy.admin_violation`; `policy` should be made
    `for_run`), which probes a set of advertised routes allows is decided once per distinct
    set, and what a reply means is worked out once per distinct reply: a fleet answers
    `{"status":"ok","alive":true}` two thousand times, and decoding, the family's judgement
    (`AdminFamily.interpret`, as `call_admin` applies it) and the storability check of the
    version are pure functions of the family, the operation, the status and the body bytes.
    """

    def __init__(
        self,
        client: DynamoClient,
        policy: OutboundPolicy,
        *,
        timeout: float,
        concurrency: int,
        release: str = "",
    ) -> None:
        self.client = client
        #: The source's Dynamo release: its contract judges the replies.
        self.release = release
        self.permits = asyncio.Semaphore(concurrency)
        self.policy = policy
        self.timeout = timeout
        self.requests = 0
        self.replies = ReplyCache()
        self._calls: dict[tuple[str, Operation], PreparedCall] = {}
        self._ops: dict[tuple[str, tuple[str, ...]], tuple[Operation, ...]] = {}
        self._readings: dict[tuple[str, Operation, int, bytes], Reading] = {}

    def _prepared(self, family: AdminFamily, op: Operation) -> PreparedCall:
        prepared = self._calls.get((family.name, op))
        if prepared is None:
            (call,) = family.build(op)
            prepared = self._calls[family.name, op] = PreparedCall.of(call)
        return prepared

    def _probes(self, family: AdminFamily, routes: tuple[str, ...]) -> tuple[Operation, ...]:
        key = (family.name, routes)
        ops = self._ops.get(key)
        if ops is None:
            ops = self._ops[key] = tuple(
                op
                for op in (Operation.GET_WEIGHT_VERSION, Operation.LIVENESS)
                if family.supports(op, routes)
            )
        return ops

    async def _call(self, obs: Observation, family: AdminFamily, op: Operation) -> Reading:
        """One probe call; the caller has judged `obs.system_url` against the policy."""
        prepared = self._prepared(family, op)
        call = prepared.call
        url = admin_url(obs.system_url, call)
        async with self.permits:
            self.requests += 1
            try:
                reply = await self.client.send(
                    call.method,
                    url,
                    json_body=prepared.wire,
                    timeout=self.timeout,
                    limit=MAX_RESPONSE_BYTES,
                )
            except TransportError as exc:
                return _reading(op, False, None, one_line(transport_failure(exc, self.timeout)))
        status, raw = reply.status, reply.raw
        if raw is None:
            return _reading(op, False, None, f"response body over {MAX_RESPONSE_BYTES} bytes")
        if 300 <= status < 400:  # the error quotes this reply's Location: never shared
            location = reply.headers.get("location", "")
            error = one_line(f"HTTP {status} redirect to {location!r} not followed")
            return _reading(op, False, None, error)
        if len(raw) > CACHED_REPLY_BYTES:
            return _judge(family, prepared, op, status, self.replies.decode(raw))
        key = (family.name, op, status, raw)
        reading = self._readings.get(key)
        if reading is None:
            if len(self._readings) >= READINGS_LIMIT:
                self._readings.clear()
            body = self.replies.decode(raw)
            reading = self._readings[key] = _judge(family, prepared, op, status, body)
        return reading

    async def probe(self, obs: Observation) -> None:
        if obs.error or not obs.system_url:
            return
        # The system_url comes from whatever the worker advertised: a URL outside the source's
        # networks makes the worker erroring and is never called.
        problem = await self.policy.admin_violation(obs.system_url)
        if problem is not None:
            obs.error = f"system_url outside allowed networks: {problem}"
            return
        if obs.family not in FAMILIES:
            return
        family = for_release(obs.family, self.release)
        ops = self._probes(family, obs.routes)
        if len(ops) == 2:
            # Both probes in flight at once, with one extra task rather than gather's two
            # (plus its bookkeeping): at 2,000 workers the task overhead is measurable.
            first = asyncio.ensure_future(self._call(obs, family, ops[0]))
            try:
                second = await self._call(obs, family, ops[1])
            except BaseException:
                first.cancel()
                raise
            readings = [await first, second]
        else:
            readings = [await self._call(obs, family, op) for op in ops]
        for op, reading in zip(ops, readings, strict=True):
            if op == Operation.GET_WEIGHT_VERSION:
                obs.version_probed = True
                obs.version_ok = reading[0]
                if reading[0]:
                    obs.weight_version, obs.weight_version_declared = reading[1], reading[2]
                else:
                    obs.version_error = reading[3]
            else:
                obs.liveness, obs.liveness_error = reading
        if obs.static_worker_id is not None and obs.liveness == "dead":
            # Nothing vouches for a static worker but its URL: one we cannot reach is refused
            # (named, so a wrong URL is a clear reason and never a half-paused refresh).
            obs.error = storable_text(
                f"static worker unreachable at {obs.system_url}: {obs.liveness_error}"
            )


def _judge(
    family: AdminFamily, prepared: PreparedCall, op: Operation, status: int, body: Any
) -> Reading:
    """A decoded reply judged as `call_admin` judges it, as a reading for `op`."""
    outcome = family.interpret(prepared.call, status, body)
    error = one_line(outcome.error) if outcome.error is not None else None
    return _reading(op, outcome.ok, outcome.data, error)


def _reading(op: Operation, ok: bool, data: dict[str, Any] | None, error: str | None) -> Reading:
    """What a probe's outcome means for the worker's row. A version we cannot store (NUL,
    NaN, too long) is a probe error for this worker, like an unreadable reply, never a failed
    refresh."""
    if op != Operation.GET_WEIGHT_VERSION:
        if ok:
            return ("alive", "")
        return ("dead", storable_text(error or "liveness failed"))
    if ok:
        data = data or {}
        version = data.get("version")
        if problem := weight_version_problem(version):
            ok, error = False, problem
        else:
            return (True, version, bool(data.get("version_declared")), "")
    return (False, None, False, storable_text(error or "version probe failed"))


async def observe(
    *,
    source_id: int,
    listener_url: str,
    policy: OutboundPolicy,
    statics: list[StaticSpec],
    listener_timeout: float,
    probe_timeout: float,
    concurrency: int,
    frontend_url: str = "",
    scope: DeclaredScope | None = None,
    release: str = "",
) -> ObservedFleet:
    """Fetch discovery and probe every worker. Raises DiscoveryError for listener problems.

    Static workers are resolved against the frontend's `/health` on every call (a restart
    changes their id); listed workers outside the declared `scope` are refused."""
    policy = policy.for_run()
    async with make_client(
        timeout=max(listener_timeout, probe_timeout), max_connections=concurrency
    ) as client:
        result = await fetch_discovery(client, policy, listener_url, timeout=listener_timeout)
        families: dict[tuple[str, ...], str] = {}
        workers = [_from_discovered(w, families) for w in result.workers]
        _refuse_out_of_scope(workers, scope or DeclaredScope(""), result.namespace)
        identities = await _static_identities(client, policy, frontend_url, statics, probe_timeout)
        workers += [_from_static(s, i) for s, i in zip(statics, identities, strict=True)]
        prober = Prober(
            client, policy, timeout=probe_timeout, concurrency=concurrency, release=release
        )
        await asyncio.gather(*(prober.probe(obs) for obs in workers))
    return ObservedFleet(result, workers, prober.requests + 1)
