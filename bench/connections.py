"""Database connections under a burst of web requests: prints figures, asserts nothing.

    DATABASE_URL=postgres://... .venv/bin/python bench/connections.py \\
        [--runs 5] [--requests 1000] [--concurrency 100] [--process web|celery] [--workers 2]

Creates a throwaway database on the server DATABASE_URL points at (PostgreSQL only: SQLite has
no server connections), migrates it, starts the real ASGI server as production runs it
(uvicorn, `--workers` processes, 2 by default, DEBUG off), and fires authenticated GETs at
`/api/v1/sources` with an httpx async client. During each run it samples pg_stat_activity for
the server's connections; it prints per run the peak, what is left after the burst, errors
(5xx and transport failures) and throughput, then median and range over the runs. The
database is dropped at the end.

`--process web` (default) is how the web server runs: a psycopg pool of at most
DATABASE_POOL_MAX_SIZE connections in each worker process, so the peak is at most workers x
that. `--process celery` gives the server Celery's persistent connections (CONN_MAX_AGE),
which is what the web server had before: expect one connection per request thread, and keep
--concurrency low — it can exhaust a shared server's connections.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# _servers configures the bench process on import: DEBUG off, a Redis prefix of its own.
from _servers import (
    admin_connect,
    server_database_url,
    session_cookie,
    start_uvicorn,
    throwaway_database,
)

APPLICATION_NAME = "cp-bench-server"
PATH = "/api/v1/sources"
#: uvicorn worker processes, as the web deployment runs by default.
WEB_WORKERS = 2


def _count(conn, dbname: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
        (dbname, APPLICATION_NAME),
    ).fetchone()[0]


async def _burst(url: str, cookies: dict, requests: int, concurrency: int) -> Counter:
    import httpx

    statuses: Counter = Counter()
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, cookies=cookies, limits=limits, timeout=60) as c:

        async def one() -> None:
            async with gate:
                try:
                    statuses[(await c.get(PATH)).status_code] += 1
                except httpx.TransportError as exc:
                    statuses[type(exc).__name__] += 1

        await asyncio.gather(*(one() for _ in range(requests)))
    return statuses


def one_run(url, cookies, admin_url, dbname, requests, concurrency) -> dict:
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        with admin_connect(admin_url) as conn:
            while not stop.is_set():
                samples.append(_count(conn, dbname))
                stop.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    statuses = asyncio.run(_burst(url, cookies, requests, concurrency))
    elapsed = time.perf_counter() - started
    stop.set()
    sampler.join()
    with admin_connect(admin_url) as conn:
        after = _count(conn, dbname)
    errors = sum(n for s, n in statuses.items() if not isinstance(s, int) or s >= 500)
    return {
        "peak": max(samples, default=0),
        "after": after,
        "errors": errors,
        "rps": requests / elapsed,
        "statuses": dict(statuses),
    }


def _summary(name: str, values: list[float], fmt: str = "{:.0f}") -> str:
    median = fmt.format(statistics.median(values))
    return f"{name} median {median} (range {fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--process", choices=("web", "celery"), default="web")
    parser.add_argument("--workers", type=int, default=WEB_WORKERS, help="uvicorn workers")
    args = parser.parse_args()

    admin_url = os.environ.get("DATABASE_URL", "")
    why = "the bench counts its connections (SQLite has no server connections)"
    with throwaway_database("bench_connections", why) as dbname:
        from django.conf import settings
        from django.db import connections

        cookies = session_cookie()
        connections.close_all()
        server = start_uvicorn(
            server_database_url(dbname, APPLICATION_NAME), args.workers, process=args.process
        )
        try:
            how = (
                f"pool max {settings.DATABASE_POOL_MAX_SIZE} per worker"
                if args.process == "web"
                else f"persistent, CONN_MAX_AGE {settings.DATABASE_CONN_MAX_AGE}"
            )
            print(
                f"{args.runs} runs of {args.requests} GET {PATH} at concurrency "
                f"{args.concurrency}; uvicorn --workers {args.workers}; server connections: "
                f"{how}; DEBUG off"
            )
            results = []
            for n in range(1, args.runs + 1):
                r = one_run(server.url, cookies, admin_url, dbname, args.requests, args.concurrency)
                results.append(r)
                print(
                    f"  run {n}: peak {r['peak']} connections, {r['after']} after, "
                    f"{r['errors']} errors, {r['rps']:.0f} req/s, statuses {r['statuses']}"
                )
            print(_summary("peak connections", [r["peak"] for r in results]))
            print(_summary("connections after", [r["after"] for r in results]))
            print(_summary("errors", [r["errors"] for r in results]))
            print(_summary("requests/s", [r["rps"] for r in results]))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
