"""The serving ledger, provenance, policy lag and canary analysis at fleet scale: prints
figures, asserts nothing.

    DATABASE_URL=postgres://... .venv/bin/python bench/new_paths.py [--workers 100,2000] [--runs 5]

Creates a throwaway PostgreSQL database on the server DATABASE_URL points at, migrates it and,
per fleet size, builds the scenario of `tests/integration/scale/paths.py`: N workers in four
namespaces refreshed from one policy to the next (the serving ledger written by the real gate
step and reopen), three published policies, and a canary refresh whose first wave (every tenth
worker) verified and whose analysis is due. Then, with DEBUG off, each path runs once to warm
up, once to count its SQL statements, and `--runs` times timed: server wall time and this
process's CPU (pages and APIs through Django's full middleware stack as a signed-in viewer, in
this process). One line per path per size: statements, then wall and CPU median and range.
The ledger's write (a gate step and a reopen of the whole fleet) runs last at each size, since
it moves the gates the other paths read. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _paired import bench_environment

bench_environment()

from _servers import throwaway_database  # noqa: E402

#: Measured last at each size (it moves the gates the others read).
WRITE_LAST = "ledger: gate step + reopen"


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 10:
        raise argparse.ArgumentTypeError("sizes are comma-separated worker counts, each >= 10")
    return sizes


def _measure(run, s, runs: int) -> dict:
    from tests.integration.scale.fleet import captured

    run(s)  # warm-up: templates compiled, the session cached
    with captured() as queries:
        run(s)
    # Read now: the log it slices is emptied again by the next request.
    statements = len(queries.captured_queries)
    walls, cpus = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        run(s)
        walls.append((time.perf_counter() - t0) * 1000)
        cpus.append((time.process_time() - c0) * 1000)
    return {"statements": statements, "wall": walls, "cpu": cpus}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ms ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=_sizes, default=[100, 2000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--only",
        default="",
        help="run only the paths whose name contains one of these (comma-separated)",
    )
    args = parser.parse_args()
    if args.runs < 5:
        sys.exit("--runs must be at least 5 (median and range of >= 5 runs)")

    with throwaway_database("bench_new_paths", "bench/new_paths.py measures on PostgreSQL"):
        from django.conf import settings
        from django.test import Client

        from controlplane.accounts.roles import Role
        from controlplane.accounts.services import create_user_with_role
        from tests.integration.scale import paths

        assert not settings.DEBUG
        viewer = create_user_with_role(
            "bench-viewer", Role.VIEWER, uuid.uuid4().hex, validate=False
        )
        client = Client()
        client.force_login(viewer)
        names = [n for n in paths.PATHS if n != WRITE_LAST] + [WRITE_LAST]
        wanted = [part for part in args.only.split(",") if part] or [""]
        names = [n for n in names if any(part in n for part in wanted)]
        counts: dict[str, dict[int, int]] = {n: {} for n in names}
        print(
            f"DEBUG off, PostgreSQL, {args.runs} timed runs per path after a warm-up and a "
            f"counted run; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        # Every size is built before any is measured: the lists (gates, /metrics, a version's
        # trail) then see the same sources at every size, as the test's do.
        built = {}
        for size in args.workers:
            t0 = time.perf_counter()
            built[size] = paths.scenario(size, client, name=f"bench-{size}")
            print(f"built {size} workers in {time.perf_counter() - t0:.1f} s")
        for size, s in built.items():
            print(f"-- {size} workers")
            for name, statements in s.built.items():
                counts.setdefault(name, {})[size] = statements
                print(f"{size:>6} workers  {name:<42} {statements:>4} statements (once)")
            for name in names:
                run, prepare = paths.PATHS[name]
                if prepare is not None:
                    prepare(s)
                m = _measure(run, s, args.runs)
                counts[name][size] = m["statements"]
                print(
                    f"{size:>6} workers  {name:<42} {m['statements']:>4} statements  "
                    f"wall {_spread(m['wall'])}  CPU {_spread(m['cpu'])}"
                )
        flat = [n for n, by_size in counts.items() if len(set(by_size.values())) == 1]
        grown = {n: by_size for n, by_size in counts.items() if len(set(by_size.values())) > 1}
        sizes = ", ".join(f"{n:,}" for n in args.workers)
        print(
            f"SUMMARY new paths at {sizes} workers: {len(flat)} of {len(counts)} paths issue "
            f"the same statements at every size" + (f"; growing: {grown}" if grown else "")
        )


if __name__ == "__main__":
    main()
