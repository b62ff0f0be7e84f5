"""The benches' simulated fleet, in a child process of its own.

Run in a thread of the bench process, the simulated fleet competes for the GIL with the code
under test and with the bare client alike, so every figure includes the server's own CPU and the
thread handoffs between them. In its own process it behaves like a real fleet on the network:
both the bare client and the control plane are measured against the same out-of-process server.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import Iterator
from typing import Any

START_TIMEOUT = 60.0


def _serve(config, routes: list[str], latency: float, conn) -> None:
    from controlplane.simfleet import Fault, SimFleetServer

    async def main() -> None:
        server = SimFleetServer(config)
        await server.start()
        assert server.fleet is not None
        fault = Fault(kind="latency", seconds=latency)
        for summary in server.fleet.summaries():
            for route in routes:
                server.fleet.inject(summary["instance_id"], route, fault)
        conn.send(server.urls())
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        # The parent closes its end of the pipe (or exits) to stop the fleet.
        loop.add_reader(conn.fileno(), stop.set)
        try:
            await stop.wait()
        finally:
            loop.remove_reader(conn.fileno())
            await server.stop()

    asyncio.run(main())


@contextlib.contextmanager
def fleet_process(config, *, latency: float, routes: list[str]) -> Iterator[dict[str, Any]]:
    """Serve `config` from a child process with `latency` injected on `routes` of every worker.

    Yields the fleet's URLs (`listener_url`, `frontend_url`, `admin_url`, `control_url`).
    """
    ctx = multiprocessing.get_context("spawn")  # no Django state, sockets or threads inherited
    parent, child = ctx.Pipe()
    process = ctx.Process(
        target=_serve, args=(config, routes, latency, child), name="simfleet", daemon=True
    )
    process.start()
    child.close()
    try:
        if not parent.poll(START_TIMEOUT):
            raise RuntimeError("simulated fleet did not start")
        yield parent.recv()
    finally:
        parent.close()
        process.join(15)
        if process.is_alive():
            process.kill()
            process.join()


@contextlib.contextmanager
def fleet_thread(config, *, latency: float, routes: list[str]) -> Iterator[dict[str, Any]]:
    """The same fleet on a thread of this process (the old setup, kept for comparison)."""
    from controlplane.simfleet import Fault, run_fleet

    with run_fleet(config) as fleet:
        fault = Fault(kind="latency", seconds=latency)
        for w in fleet.workers():
            for route in routes:
                fleet.inject(w["instance_id"], route, fault)
        yield {
            "listener_url": fleet.listener_url,
            "frontend_url": fleet.frontend_url,
            "admin_url": fleet.admin_url,
            "control_url": fleet.control_url,
        }


def serve_fleet(config, latency: float, routes: list[str], in_thread: bool = False):
    factory = fleet_thread if in_thread else fleet_process
    return factory(config, latency=latency, routes=routes)
