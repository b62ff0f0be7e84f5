"""Peak memory of the web, Celery and executor processes at fleet scale: prints figures,
asserts nothing.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python bench/memory.py \
        [--workers 2000 10000] [--parts celery executor web]

For each fleet size, in a throwaway PostgreSQL database (`bench/_servers.py`) with the
simulated fleet of N workers in its own process (`bench/_fleet.py`, routes answering in
`--latency-ms`):

- **Celery**: a worker as production runs it (`celery -A controlplane worker --pool threads`,
  CONTROLPLANE_PROCESS=celery) runs one discovery of the N workers (every worker joins: the
  largest discovery there is) from the broker;
- **executor**: a fresh child process (spawned: no state inherited) runs
  `controlplane.refresh.executor.execute_refresh` on a planned policy refresh of the N
  workers, as `bench/policy_refresh.py` does, to its end;
- **web**: uvicorn as production runs it (one worker process, DEBUG off) serves a viewer the
  fleet overview, the source page (first and last page of workers), the fleet map, the
  refresh page and the JSON API (worker list, a version's provenance, the refresh's capacity),
  each three times.

Reads each process's resident set from /proc (VmRSS when ready, VmHWM — the peak — after the
work) and prints both, their difference, and, over two or more sizes, the peak's growth per
worker between the smallest and the largest fleet (the "bounded" figure: kB per worker).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# _servers configures the bench process on import: DEBUG off, a Redis prefix of its own.
from _fleet import fleet_process
from _servers import (
    ROOT,
    process_tree,
    server_database_url,
    start_uvicorn,
    stop,
    throwaway_database,
)

PARTS = ("celery", "executor", "web")
#: The weight version the measured refresh moves the fleet to.
VERSION = "mem-1"
#: Seconds a discovery or a refresh of the largest fleet may take on a busy machine.
WORK_TIMEOUT = 600.0


def args_timeout() -> float:
    """The refresh's time limit (`--refresh-timeout`, passed down to the per-size process)."""
    return float(os.environ.get("BENCH_MEMORY_REFRESH_TIMEOUT", WORK_TIMEOUT))


def kb(pid: int, field: str) -> int:
    """`VmRSS` or `VmHWM` of a process, in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def _fleet_config(n: int):
    from controlplane.simfleet import FleetConfig

    return FleetConfig.generate(
        workers=n,
        namespaces=["rl-a", "rl-b", "rl-c"],
        prefix="rl",
        seed=7,
        listener_env={"DYN_RL_MAX_CONCURRENT_PROBES": "4096"},
    )


# -- Celery ------------------------------------------------------------------------------------


def celery_discovery(dbname: str, source_id: int) -> tuple[int, int]:
    """(ready RSS, peak RSS) in kB of a Celery worker that ran one discovery of the source."""
    from controlplane.celery import app
    from controlplane.fleet.models import DiscoveryRun, DiscoveryTrigger
    from controlplane.fleet.tasks import run_discovery_task

    env = dict(
        os.environ,
        DATABASE_URL=server_database_url(dbname, "cp-bench-memory-celery"),
        CONTROLPLANE_PROCESS="celery",
    )
    name = f"bench-memory-{uuid.uuid4().hex[:8]}@localhost"
    command = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool", "threads"]
    command += ["-c", "2", "-n", name, "-l", "WARNING", "--without-gossip", "--without-mingle"]
    worker = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # its start-up banner and warnings, not figures
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[name], timeout=1.0):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the Celery worker did not start")
        ready = kb(worker.pid, "VmRSS")
        before = DiscoveryRun.objects.filter(source_id=source_id).count()
        run_discovery_task.delay(source_id, DiscoveryTrigger.MANUAL.value)
        deadline = time.monotonic() + WORK_TIMEOUT
        while True:
            runs = DiscoveryRun.objects.filter(source_id=source_id, finished_at__isnull=False)
            if runs.count() > before:
                break
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the discovery did not finish")
            time.sleep(0.5)
        return ready, kb(worker.pid, "VmHWM")
    finally:
        stop([worker])


# -- the executor ------------------------------------------------------------------------------


def _execute(database_url: str, refresh_id: int, conn) -> None:
    os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()
    from controlplane.refresh.executor import execute_refresh

    ready = kb(os.getpid(), "VmRSS")
    state = execute_refresh(refresh_id)
    conn.send((ready, kb(os.getpid(), "VmHWM"), str(state)))


def executor_refresh(dbname: str, source, actor) -> tuple[int, int, int]:
    """(ready RSS, peak RSS, refresh id) of a fresh process running one policy refresh."""
    from controlplane.refresh import intents

    refresh = intents.plan_policy_refresh(
        source=source,
        actor=actor,
        target={"weight_version": VERSION, "method": "disk", "model_path": "/ckpt"},
    )
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor, enqueue=False)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    url = server_database_url(dbname, "cp-bench-memory-executor")
    process = ctx.Process(target=_execute, args=(url, refresh.pk, child), name="executor")
    process.start()
    child.close()
    try:
        if not parent.poll(args_timeout()):
            raise TimeoutError(f"the refresh did not finish in {args_timeout():.0f} s")
        ready, peak, state = parent.recv()
    finally:
        if process.is_alive():
            process.kill()
        process.join(30)
    print(f"    refresh {refresh.pk} ended {state}")
    return ready, peak, refresh.pk


# -- the web process ---------------------------------------------------------------------------


def web_pages(dbname: str, source, refresh_id: int | None) -> tuple[int, int]:
    """(ready RSS, peak RSS) of one uvicorn worker serving the pages and APIs."""
    from django.conf import settings
    from django.test import Client
    from django.urls import reverse

    from controlplane.accounts import tokens
    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role
    from controlplane.audit.recorder import Actor

    user = create_user_with_role(
        f"bench-mem-{uuid.uuid4().hex[:6]}", Role.VIEWER, uuid.uuid4().hex, validate=False
    )
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    _, secret = tokens.create_token(
        user=user, label="bench", actor=Actor.system("bench"), sources=[source]
    )
    workers = source.workers.count()
    pages = [
        (reverse("fleet:overview"), {}),
        (reverse("fleet:source", args=[source.pk]), {}),
        (reverse("fleet:source", args=[source.pk]) + f"?page={-(-workers // 100)}", {}),
        (reverse("fleet:source_map", args=[source.pk]), {"HX-Request": "true"}),
    ]
    api = [reverse("intake:api-v1:list_workers") + "?limit=100"]
    if refresh_id is not None:  # the refresh's version has a provenance: the refreshed fleet
        pages.append((reverse("refresh:detail", args=[refresh_id]), {}))
        api.append(reverse("intake:api-v1:get_refresh_capacity", args=[refresh_id]))
        api.append(reverse("intake:api-v1:get_provenance", args=[VERSION]))
    calls = [(url, {"Cookie": cookie} | extra) for url, extra in pages]
    calls += [(url, {"Authorization": f"Bearer {secret}"}) for url in api]

    server = start_uvicorn(server_database_url(dbname, "cp-bench-memory-web"), 1)
    try:
        pid = max(process_tree(server.process.pid))  # the serving process (no supervisor at 1)
        ready = kb(pid, "VmRSS")
        for round_ in range(3):
            for url, headers in calls:
                before = kb(pid, "VmHWM")
                request = urllib.request.Request(server.url + url, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=120) as response:
                        size = len(response.read())
                except urllib.error.HTTPError as error:
                    raise RuntimeError(f"{url}: {error}") from None
                if round_ == 0:
                    # What each request raised the peak by, the first time it is served: the
                    # request that makes a process grow with the fleet is named here.
                    grew = (kb(pid, "VmHWM") - before) / 1024
                    print(f"    web: {url} {size / 1024:.0f} KB, peak +{grew:.1f} MB", flush=True)
        return ready, kb(pid, "VmHWM")
    finally:
        server.stop()


# -- the run -----------------------------------------------------------------------------------


def measure(n: int, parts: list[str], latency: float) -> dict[str, tuple[int, int]]:
    """(ready, peak) RSS in kB per measured process, for a fleet of `n` workers."""
    found: dict[str, tuple[int, int]] = {}
    with throwaway_database("bench_memory") as dbname:
        from controlplane.accounts.roles import Role
        from controlplane.accounts.services import create_user_with_role
        from controlplane.audit.recorder import Actor
        from controlplane.fleet import services
        from controlplane.fleet.discovery import run_discovery
        from controlplane.fleet.models import DiscoveryTrigger

        user = create_user_with_role("bench-operator", Role.OPERATOR, "x", validate=False)
        actor = Actor.for_user(user)
        with fleet_process(_fleet_config(n), latency=latency, routes=["*", "generate"]) as urls:
            source = services.create_source(
                actor=actor,
                name="bench-memory",
                listener_url=urls["listener_url"],
                frontend_url=urls["frontend_url"],
                allowed_networks=["127.0.0.0/8"],
                expected_prefix="rl",
            )
            t0 = time.perf_counter()
            if "celery" in parts:
                found["celery (discovery)"] = celery_discovery(dbname, source.pk)
                _show(found, "celery (discovery)", n)
            else:
                run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL)
            print(f"  {n} workers discovered in {time.perf_counter() - t0:.0f} s", flush=True)
            refresh_id = None
            if "executor" in parts:
                t0 = time.perf_counter()
                try:
                    ready, peak, refresh_id = executor_refresh(dbname, source, actor)
                except TimeoutError as error:
                    print(f"  executor: {error}", flush=True)
                else:
                    found["executor (refresh)"] = (ready, peak)
                    _show(found, "executor (refresh)", n)
                    print(f"  refresh of {n} workers took {time.perf_counter() - t0:.0f} s")
            if "web" in parts:
                found["web (pages, API)"] = web_pages(dbname, source, refresh_id)
                _show(found, "web (pages, API)", n)
    return found


def _show(found: dict[str, tuple[int, int]], name: str, n: int) -> None:
    ready, peak = found[name]
    print(
        f"  {name:<20} {n:>6} workers: ready {ready / 1024:6.1f} MB, peak "
        f"{peak / 1024:6.1f} MB (+{(peak - ready) / 1024:.1f} MB)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument(
        "--refresh-timeout", type=float, default=WORK_TIMEOUT, help="seconds; then killed"
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["BENCH_MEMORY_REFRESH_TIMEOUT"] = str(args.refresh_timeout)
    sizes = sorted(args.workers)
    if len(sizes) == 1:
        found = measure(sizes[0], args.parts, args.latency_ms / 1000)
        if args.json:
            print("RESULT " + json.dumps(found), flush=True)
        return
    # One process per size: Django's connection pool and settings belong to one database.
    results: dict[int, dict[str, list[int]]] = {}
    for n in sizes:
        command = [sys.executable, __file__, "--workers", str(n), "--json", "--parts"]
        command += [*args.parts, "--latency-ms", str(args.latency_ms)]
        with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as child:
            assert child.stdout is not None
            for line in child.stdout:
                if line.startswith("RESULT "):
                    results[n] = json.loads(line.removeprefix("RESULT "))
                else:
                    print(line, end="", flush=True)
    load = os.getloadavg()[0]
    print(f"memory, load average {load:.1f} on {os.cpu_count()} CPUs:")
    low, high = sizes[0], sizes[-1]
    for name in results[low]:
        peaks = {n: results[n][name][1] for n in sizes if name in results.get(n, {})}
        if high not in peaks:
            continue
        line = ", ".join(f"{n}: {peak / 1024:.1f} MB" for n, peak in peaks.items())
        slope = (peaks[high] - peaks[low]) / (high - low)
        print(f"  {name:<20} peak {line}; {slope:.2f} kB per worker from {low} to {high}")


if __name__ == "__main__":
    main()
