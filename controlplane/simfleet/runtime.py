"""Starting and stopping a simulated fleet: on the current loop, or on a background thread.

`SimFleetServer` binds the listener, admin and frontend ports on the current event loop.
`run_fleet(config)` runs one on a daemon thread and yields a `FleetHandle` with synchronous
methods, which is what tests and the demo use.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from controlplane.simfleet.config import FleetConfig, WorkerSpec
from controlplane.simfleet.faults import Fault
from controlplane.simfleet.fleet import SimFleet
from controlplane.simfleet.servers.common import HttpServer
from controlplane.simfleet.servers.control import ControlApi
from controlplane.simfleet.servers.frontend import Frontend
from controlplane.simfleet.servers.listener import Listener
from controlplane.simfleet.servers.system import SystemServers

T = TypeVar("T")
START_TIMEOUT = 30.0
CALL_TIMEOUT = 30.0


class SimFleetServer:
    """All three servers of one simulated deployment, on the running event loop."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.fleet: SimFleet | None = None
        self._servers: list[HttpServer] = []
        self.listener_url = self.frontend_url = self.admin_url = ""

    @property
    def control_url(self) -> str:
        return f"{self.admin_url}/_sim"

    def urls(self) -> dict[str, str]:
        return {
            "listener_url": self.listener_url,
            "frontend_url": self.frontend_url,
            "admin_url": self.admin_url,
            "control_url": self.control_url,
        }

    async def start(self) -> None:
        config, host = self.config, self.config.host
        # URLs (system_url in discovery, the printed URLs) use the advertised name, if any.
        public = config.advertise_host or host
        # The admin port comes first: workers' system_url needs its number. Handlers look the
        # fleet up lazily, so binding before the fleet exists is safe.
        admin = HttpServer(lambda r: self._systems.handle(r), host, config.admin_port)
        admin_port = await admin.start()
        self._servers.append(admin)
        self.admin_url = f"http://{public}:{admin_port}"
        fleet = self.fleet = SimFleet(config, self.admin_url)
        self._systems = SystemServers(fleet, ControlApi(fleet, self.urls).handle)
        listener = Listener(fleet, config.listener_env, admin_port)
        for attr, handler, port in (
            ("listener_url", listener.handle, config.listener_port),
            ("frontend_url", Frontend(fleet).handle, config.frontend_port),
        ):
            server = HttpServer(handler, host, port)
            bound = await server.start()
            self._servers.append(server)
            setattr(self, attr, f"http://{public}:{bound}")
        for spec in config.workers:
            fleet.add_worker(spec)
        if config.churn_interval:
            fleet.start_churn(config.churn_interval)

    async def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stopping.set()
            self.fleet.stop_churn()
            for worker in self.fleet.workers.values():
                worker.running.set()
        for server in reversed(self._servers):
            await server.stop()
        self._servers.clear()


class FleetHandle:
    """Synchronous, thread-safe access to a fleet running on a background loop.

    Every method hops onto the fleet's loop, so state is only ever touched by that thread.
    Methods mirror `SimFleetControl` (the HTTP client) and return the same JSON shapes.
    """

    def __init__(self, server: SimFleetServer, loop: asyncio.AbstractEventLoop) -> None:
        self._server = server
        self._loop = loop
        self.listener_url = server.listener_url
        self.frontend_url = server.frontend_url
        self.admin_url = server.admin_url
        self.control_url = server.control_url

    @property
    def fleet(self) -> SimFleet:
        """The live registry; only touch it from the fleet loop (see `call`)."""
        assert self._server.fleet is not None
        return self._server.fleet

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` on the fleet loop and return its result (exceptions propagate)."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(CALL_TIMEOUT)

    def add_worker(self, spec: WorkerSpec | dict[str, Any]) -> str:
        return self.call(lambda: self.fleet.add_worker(spec))

    def remove_worker(self, key: str | int) -> None:
        self.call(lambda: self.fleet.remove_worker(key))

    def restart(self, key: str | int) -> int:
        """Restart the worker's process (new instance id, base weights); returns the new id."""
        return self.call(lambda: self.fleet.restart(key))

    def inject(self, key: str | int, route: str, fault: Fault | dict[str, Any]) -> None:
        self.call(lambda: self.fleet.inject(key, route, fault))

    def clear_faults(self, key: str | int | None = None) -> None:
        self.call(lambda: self.fleet.clear_faults(key))

    def set_version(self, key: str | int, version: Any) -> None:
        self.call(lambda: self.fleet.set_version(key, version))

    def set_world_size(self, key: str | int, world_size: int | None) -> None:
        self.call(lambda: self.fleet.set_world_size(key, world_size))

    def set_latency(self, key: str | int, latency: dict[str, Any] | None) -> None:
        """The worker's serving latency (`LatencyConfig` as JSON), or None for the default."""
        self.call(lambda: self.fleet.set_latency(key, latency))

    def lineage(self) -> dict[str, Any] | None:
        return self.call(self.fleet.lineage_view)

    def set_lineage(self, lineage: dict[str, Any] | None) -> None:
        self.call(lambda: self.fleet.set_lineage(lineage))

    def set_broken(self, version: Any, broken: str | dict[str, Any] | None) -> None:
        """Mark `version` a broken checkpoint (`"drift"`, `{"kind": "marginal"}`, ...), or
        healthy again with None."""
        self.call(lambda: self.fleet.set_broken(version, broken))

    def state(self, key: str | int) -> dict[str, Any]:
        return self.call(lambda: self.fleet.state(key))

    def workers(self) -> list[dict[str, Any]]:
        return self.call(self.fleet.summaries)

    def events(self) -> list[dict[str, Any]]:
        return self.call(lambda: list(self.fleet.events))

    def groups(self) -> list[dict[str, Any]]:
        """The collective weight-update groups the workers joined."""
        return self.call(self.fleet.collectives.views)

    def broadcast(self, version: Any, group_name: str | None = None) -> int:
        """The stand-in trainer broadcasts to every formed group (or the named one)."""
        return self.call(lambda: self.fleet.collectives.broadcast(version, group_name))

    def set_churn(self, interval: float | None) -> None:
        """Start automatic membership churn every `interval` seconds, or stop it with None."""
        if interval:
            self.call(lambda: self.fleet.start_churn(interval))
        else:
            self.call(self.fleet.stop_churn)


@contextlib.contextmanager
def run_fleet(config: FleetConfig | None = None, **generate: Any) -> Iterator[FleetHandle]:
    """Run a simulated fleet on a background thread for the duration of the block.

    `run_fleet(config)` or `run_fleet(workers=4, namespaces=["rl-a", "rl-b"], prefix="rl")`.
    """
    if config is None:
        config = FleetConfig.generate(**generate)
    loop = asyncio.new_event_loop()
    server = SimFleetServer(config)
    started: Future[None] = Future()

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(target=main, name="simfleet", daemon=True)
    thread.start()
    try:
        started.result(START_TIMEOUT)
    except BaseException:
        thread.join(5)
        raise
    try:
        yield FleetHandle(server, loop)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(15)
