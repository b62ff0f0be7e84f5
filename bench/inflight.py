"""The refresh page's "requests in flight" table at fleet scale, timed: prints, asserts nothing.

    DATABASE_URL=postgres://... .venv/bin/python bench/inflight.py [--workers 10000] [--runs 5]

Creates a throwaway PostgreSQL database, writes one refresh of N workers in the middle of its
update (`tests/fixtures/scale.make_refresh`: a pause journaled for every worker) whose pause
replies report the mode applied, as vLLM's do, then times `refresh.inflight.in_flight_table`
(the page shows 100 rows, its totals count every worker) with DEBUG off: median and range over
`--runs` (wall and this process's CPU), and its statement count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _paired import bench_environment

bench_environment()

from _servers import throwaway_database  # noqa: E402

MODES = ("wait", "abort", "keep")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.runs < 5:
        sys.exit("--runs must be at least 5 (median and range of >= 5 runs)")

    with throwaway_database("bench_inflight", "bench/inflight.py measures on PostgreSQL"):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from controlplane.fleet.models import Source
        from controlplane.refresh.inflight import in_flight_table
        from controlplane.refresh.models import JournalEntry
        from tests.fixtures.scale import make_refresh

        source = Source.objects.create(
            name="bench-inflight",
            listener_url="http://127.0.0.1:9/",
            frontend_url="http://127.0.0.1:9/",
            allowed_networks=["10.0.0.0/8"],
        )
        refresh = make_refresh(source, args.workers)
        # vLLM's pause reply echoes the mode it applied: a third of each.
        for i, mode in enumerate(MODES):
            JournalEntry.objects.filter(
                refresh=refresh, operation="pause", planned_worker_id__isnull=False
            ).extra(where=[f"planned_worker_id %% {len(MODES)} = {i}"]).update(
                response_body={
                    "status": "ok",
                    "message": "Engine paused",
                    "mode": mode,
                    "clear_cache": False,
                }
            )
        table = in_flight_table(refresh)  # warm-up
        with CaptureQueriesContext(connection) as queries:
            in_flight_table(refresh)
        times, cpus = [], []
        for _ in range(args.runs):
            t0, c0 = time.perf_counter(), time.process_time()
            in_flight_table(refresh)
            times.append((time.perf_counter() - t0) * 1000)
            cpus.append((time.process_time() - c0) * 1000)
        print(
            f"in_flight_table, {args.workers} workers, DEBUG off, PostgreSQL, load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: "
            f"wall {statistics.median(times):.1f} ms ({min(times):.1f}-{max(times):.1f}), "
            f"CPU {statistics.median(cpus):.1f} ms ({min(cpus):.1f}-{max(cpus):.1f}), "
            f"{len(queries.captured_queries)} statements; {len(table.rows)} rows shown, "
            f"totals {table.totals}"
        )


if __name__ == "__main__":
    main()
