"""Discovery benchmark: prints figures, asserts nothing.

    DATABASE_URL=postgres://... .venv/bin/python bench/discovery.py [--workers 2000]
        [--latency-ms 20] [--repetitions 5]

1. A simulated source of N vLLM workers whose admin routes answer after `latency` ms, served
   from a child process (`--fleet-in-thread` serves it from a thread of this process). Each
   repetition times one full discovery refresh (listener + version/liveness probes + upsert +
   diff + audit + publish) and, in alternating order, a bare aiohttp client doing only the same
   HTTP calls (and parsing the listing) with the same concurrency (`_fanout.bare_discovery`;
   the pairing: `_paired.py`). Two kinds: cold (a new source, so every worker joins:
   inserts) and steady (nothing changed).
2. Server time and SQL query count to render the source page at 100 and N workers
   (`--no-page` leaves it out).

DEBUG is off; a throwaway SQLite database is used unless DATABASE_URL is set.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _fanout import bare_discovery  # bench/ is sys.path[0] when a bench runs as a script
from _fleet import serve_fleet
from _paired import alternate, bench_environment, report, setup_django

bench_environment()


def render_page(source, user) -> tuple[float, int, int]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(user)
    client.get(f"/sources/{source.pk}/")  # warm caches (templates, permissions)
    best = float("inf")
    for _ in range(3):
        with CaptureQueriesContext(connection) as queries:
            t0 = time.perf_counter()
            response = client.get(f"/sources/{source.pk}/")
            best = min(best, time.perf_counter() - t0)
    assert response.status_code == 200, response.status_code
    return best, len(queries.captured_queries), response.content.decode().count('<tr id="worker-')


def synthetic_source(name: str, n: int):
    from django.utils import timezone

    from controlplane.audit.recorder import Actor
    from controlplane.fleet import services
    from controlplane.fleet.models import Worker

    source = services.create_source(
        actor=Actor.system("bench"),
        name=name,
        listener_url="http://10.0.0.1:8001",
        allowed_networks=["10.0.0.0/8"],
        expected_prefix="rl",
    )
    now = timezone.now()
    routes = [
        "get_weight_version",
        "liveness_probe",
        "pause_generation",
        "resume_generation",
        "update_weights_from_disk",
        "flush_cache",
    ]
    Worker.objects.bulk_create(
        Worker(
            source=source,
            namespace=f"rl-{i % 4}",
            component="backend",
            endpoint="rl",
            instance_id=str(2**63 + i),
            routes=routes,
            family="vllm",
            system_url=f"http://10.0.{i // 250}.{i % 250}:9000/w/x{i}",
            model="sim-model",
            weight_version=f"step-{i % 3}",
            version_probed_at=now,
            liveness="alive",
            first_seen_at=now,
            last_seen_at=now,
        )
        for i in range(n)
    )
    return source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--no-page", action="store_true", help="skip the source page figures")
    parser.add_argument(
        "--fleet-in-thread",
        action="store_true",
        help="serve the simulated fleet from a thread of this process (shares the GIL)",
    )
    args = parser.parse_args()
    setup_django()

    from django.conf import settings

    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role
    from controlplane.audit.recorder import Actor
    from controlplane.fleet import services
    from controlplane.fleet.discovery import run_discovery
    from controlplane.fleet.models import DiscoveryTrigger
    from controlplane.simfleet import FleetConfig

    n, concurrency = args.workers, settings.DISCOVERY_PROBE_CONCURRENCY
    config = FleetConfig.generate(
        workers=n,
        namespaces=["rl-a", "rl-b", "rl-c"],
        prefix="rl",
        seed=7,
        listener_env={"DYN_RL_MAX_CONCURRENT_PROBES": "4096"},
    )
    print(
        f"discovery bench: {n} workers, admin routes answer in {args.latency_ms:g} ms, "
        f"probe concurrency {concurrency}, database {settings.DATABASES['default']['ENGINE']}, "
        f"DEBUG {settings.DEBUG}, fleet in "
        f"{'a thread' if args.fleet_in_thread else 'a child process'}, "
        f"{args.repetitions} alternating pairs per kind"
    )
    run_id = uuid.uuid4().hex[:8]  # a reused database keeps earlier runs' rows
    latency = args.latency_ms / 1000.0
    results = {}
    t0 = time.perf_counter()
    with serve_fleet(config, latency, ["*"], args.fleet_in_thread) as urls:
        listener_url = urls["listener_url"]

        def new_source(name: str):
            return services.create_source(
                actor=Actor.system("bench"),
                name=f"{name}-{run_id}",
                listener_url=listener_url,
                allowed_networks=["127.0.0.0/8"],
                expected_prefix="rl",
            )

        steady_source = new_source("steady")
        run_discovery(steady_source.pk, trigger=DiscoveryTrigger.MANUAL)
        requests: list[int] = []

        def ours(source) -> None:
            run = run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL)
            assert run is not None and run.ok, run and run.error
            assert run.workers_total == n, run.workers_total

        def bare(_source) -> None:
            listener = listener_url.rstrip("/") + "/v1/rl/workers"
            requests.append(asyncio.run(bare_discovery(listener, concurrency)))

        for kind, prepare in (
            ("cold (every worker joins)", lambda i: new_source(f"cold{i}")),
            ("steady (nothing changed)", lambda i: steady_source),
        ):
            print(f"\n{kind}:")
            results[kind] = alternate(args.repetitions, prepare, ours, bare)
    print(f"\n{max(requests)} HTTP calls per refresh; bench took {time.perf_counter() - t0:.0f} s")
    for kind, pairs in results.items():
        print(f"\n--- {kind}")
        report(
            f"discovery refresh {kind}, {n} workers, {args.latency_ms:g} ms routes",
            pairs,
            ideal=max(requests) * latency / concurrency,
            targets=(1.3, 1.2),
        )

    if args.no_page:
        return
    viewer = create_user_with_role(f"bench-viewer-{run_id}", Role.VIEWER, "x", validate=False)
    print("\nsource page render (best of 3, Django test client, in-process):")
    for size in (100, n):
        src = synthetic_source(f"page-{size}-{run_id}", size)
        seconds, queries, rows = render_page(src, viewer)
        print(f"  {size:5} workers: {seconds * 1000:7.1f} ms  {queries:3} SQL queries  {rows} rows")


if __name__ == "__main__":
    main()
