"""Every worker's system server, multiplexed on one admin port by path (contract §3).

`system_url = {admin_url}/w/{token}`, so `{system_url}/engine/<route>`, `/health`, `/live` and
`/metrics` resolve with one dict lookup. A token that no longer belongs to a live worker drops
the connection, like a worker process that has exited. `/_sim/...` is the control API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from controlplane.simfleet.faults import HEALTH, Fault
from controlplane.simfleet.fleet import SimFleet
from controlplane.simfleet.servers.common import (
    TEXT_JSON,
    DropConnection,
    json_response,
    note_trace_headers,
    pause_for,
    read_json_body,
)
from controlplane.simfleet.workers import Reply, SimWorker, VllmWorker

ENGINE_PREFIX = "/engine/"


def _route_not_found(path: str) -> Reply:
    return Reply(404, {"error": "Route not found", "message": f"Route {path} not found"})


class SystemServers:
    """Serves the admin port: worker system servers plus the control API."""

    def __init__(
        self,
        fleet: SimFleet,
        control: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
    ) -> None:
        self.fleet = fleet
        self.control = control

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == "/_sim" or path.startswith("/_sim/"):  # the bare URL the demo prints too
            return await self.control(request)
        if not path.startswith("/w/"):
            return web.Response(status=404)
        token, slash, rest = path[3:].partition("/")
        worker = self.fleet.workers.get(token)
        if worker is None or worker.system_url is None:
            raise DropConnection
        note_trace_headers(self.fleet.received_headers, token, request)
        rest = slash + rest
        if rest in ("/health", "/live"):
            return await self._health(worker)
        if rest == "/metrics":
            return web.Response(text=self._metrics(worker), content_type="text/plain")
        if rest.startswith(ENGINE_PREFIX) or rest == "/engine":
            reply = await self._engine(worker, request, rest)
            return json_response(reply.body, reply.status, content_type=TEXT_JSON)
        return web.Response(status=404)

    async def _health(self, worker: SimWorker) -> web.StreamResponse:
        reply = worker.health()
        for fault in worker.faults.take(HEALTH, wildcard=False):
            reply = await self._apply(worker, HEALTH, fault) or reply
        return json_response(reply.body, reply.status)

    @staticmethod
    def _metrics(worker: SimWorker) -> str:
        """The worker runtime's `generate` endpoint metrics (as 1.6.1 labels them) and our
        flush counter."""
        flush = f'namespace="{worker.namespace}",component="{worker.component}"'
        return (
            worker.generate_metrics.render()
            + "# TYPE simfleet_flush_total counter\n"
            + f"simfleet_flush_total{{{flush}}} {worker.flush_count}\n"
        )

    async def _engine(self, worker: SimWorker, request: web.BaseRequest, path: str) -> Reply:
        route = path[len(ENGINE_PREFIX) :]
        handler = worker.routes.get(route)
        # `/engine`, `/engine/` and trailing slashes never match a registered route.
        if handler is None:
            reply = _route_not_found(path)
            worker.log_call(route, request.method, None, reply)
            return reply
        parsed, body = await read_json_body(request)
        if not parsed:
            reply = Reply(400, {"error": "Invalid JSON", "message": body})
            worker.log_call(route, request.method, None, reply)
            return reply
        worker.before_engine_call(route)
        faults = worker.faults.take(route)
        post: list[Fault] = []
        for fault in faults:
            if fault.kind == "revert_version":
                post.append(fault)
                continue
            injected = await self._apply(worker, route, fault)
            if injected is not None:
                worker.log_call(route, request.method, body, injected, note=f"fault:{fault.kind}")
                return injected
        if worker.dead:
            raise DropConnection
        reply = await handler(body)
        if worker.dead:
            # The handler's own watchdog ended the process (vLLM init-group timeout).
            worker.log_call(route, request.method, body, None, note="worker exited")
            raise DropConnection
        if post and reply.status == 200:
            worker.revert_version()
        worker.log_call(route, request.method, body, reply)
        return reply

    async def _apply(self, worker: SimWorker, route: str, fault: Fault) -> Reply | None:
        """Play one pre-handler fault; a Reply short-circuits the route."""
        kind = fault.kind
        if kind in ("latency", "hang"):
            watchdog = self._watchdog(worker, route)
            if kind == "hang" and watchdog is not None and fault.seconds > watchdog:
                # vLLM's init-group watchdog fires and the worker process exits.
                await pause_for(watchdog, self.fleet.stopping)
                worker.log_call(route, "-", None, None, note="watchdog: worker exited")
                self.fleet.crash(worker)
                raise DropConnection
            await pause_for(fault.seconds, self.fleet.stopping)
            if worker.dead:
                raise DropConnection
            return None
        if kind == "error_body":
            return worker.error_reply(fault.message)
        if kind == "http_error":
            return Reply(fault.status, {"error": "Handler error", "message": fault.message})
        if kind == "body":
            return Reply(200, fault.body)
        if kind == "missing":
            return _route_not_found(f"{ENGINE_PREFIX}{route}")
        if kind == "drop":
            worker.log_call(route, "-", None, None, note="fault:drop")
            raise DropConnection
        if kind == "crash":
            worker.log_call(route, "-", None, None, note="fault:crash")
            self.fleet.crash(worker)
            raise DropConnection
        return None  # probe/generate-only kinds do nothing on admin routes

    @staticmethod
    def _watchdog(worker: SimWorker, route: str) -> float | None:
        if isinstance(worker, VllmWorker) and route == "init_weights_update_group":
            return worker.spec.init_weights_timeout
        return None
