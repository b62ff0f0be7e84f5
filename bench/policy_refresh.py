"""Policy refresh benchmark: prints figures, asserts nothing.

    DATABASE_URL=postgres://... .venv/bin/python bench/policy_refresh.py [--workers 500]
        [--latency-ms 20] [--repetitions 5]

A simulated source of N vLLM workers whose admin routes (and pinned generations) answer after
`latency` ms, served from a child process (`--fleet-in-thread`: from a thread of this process).
Each repetition executes one full policy refresh (close gate → resolve → pause → update →
flush (skipped: the disk update invalidates the cache) → resume → verify (version readback,
liveness, pinned generation) → re-resolve → reopen) with journal, audit rows and websocket
publishing, and, in alternating order, a bare aiohttp client making the same HTTP calls with the
same concurrency bound and no bookkeeping (see `_paired.py`). Planning (a fresh discovery) is
done before each pair and not timed. DEBUG is off; a throwaway SQLite database is used unless
DATABASE_URL is set.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _fanout import bare_client, planned_calls  # bench/ is sys.path[0] when a bench runs
from _fleet import serve_fleet
from _paired import alternate, bench_environment, report, setup_django

bench_environment()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=500)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repetitions", type=int, default=5)
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
    from controlplane.refresh import intents
    from controlplane.refresh.executor import execute_refresh
    from controlplane.refresh.models import JournalEntry, RefreshState
    from controlplane.simfleet import FleetConfig

    n, concurrency = args.workers, settings.REFRESH_CONCURRENCY
    config = FleetConfig.generate(
        workers=n,
        namespaces=["rl-a", "rl-b", "rl-c"],
        prefix="rl",
        seed=7,
        listener_env={"DYN_RL_MAX_CONCURRENT_PROBES": "4096"},
    )
    print(
        f"policy refresh bench: {n} workers, routes answer in {args.latency_ms:g} ms, "
        f"concurrency {concurrency}, database {settings.DATABASES['default']['ENGINE']}, "
        f"DEBUG {settings.DEBUG}, fleet in "
        f"{'a thread' if args.fleet_in_thread else 'a child process'}, "
        f"{args.repetitions} alternating pairs"
    )
    run_id = uuid.uuid4().hex[:8]  # a reused database keeps earlier runs' rows
    user = create_user_with_role(f"bench-operator-{run_id}", Role.OPERATOR, "x", validate=False)
    actor = Actor.for_user(user)
    latency = args.latency_ms / 1000.0
    with serve_fleet(config, latency, ["*", "generate"], args.fleet_in_thread) as urls:
        source = services.create_source(
            actor=actor,
            name=f"bench-{run_id}",
            listener_url=urls["listener_url"],
            frontend_url=urls["frontend_url"],
            allowed_networks=["127.0.0.0/8"],
            expected_prefix="rl",
        )
        run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL)
        calls_per_run: list[int] = []

        def prepare(i: int):
            refresh = intents.plan_policy_refresh(
                source=source,
                actor=actor,
                target={"weight_version": f"v{i + 1}", "method": "disk", "model_path": "/ckpt"},
            )
            assert not refresh.plan_blockers, refresh.plan_blockers
            intents.start_policy_refresh(refresh, actor=actor, enqueue=False)
            return refresh, planned_calls(refresh)

        def ours(context) -> None:
            refresh, _ = context
            state = execute_refresh(refresh.pk)
            assert state == RefreshState.SUCCEEDED, state

        def bare(context) -> None:
            _refresh, (listener, steps) = context
            calls_per_run.append(asyncio.run(bare_client(listener, steps, concurrency)))

        t0 = time.perf_counter()
        pairs = alternate(args.repetitions, prepare, ours, bare)
        journaled = JournalEntry.objects.filter(refresh__source=source).count()

    calls = max(calls_per_run)
    print(
        f"\n{calls} HTTP calls per refresh ({journaled // args.repetitions} journaled per "
        f"refresh, 2 listener reads not journaled as calls); bench took "
        f"{time.perf_counter() - t0:.0f} s"
    )
    report(
        f"policy refresh, {n} workers, {args.latency_ms:g} ms routes",
        pairs,
        ideal=calls * latency / concurrency,
        targets=(1.3, 1.3),
    )


if __name__ == "__main__":
    main()
