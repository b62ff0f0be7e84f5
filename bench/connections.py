"""Database connections under a burst of web requests: prints figures, asserts nothing.

    DATABASE_URL=postgres://... .venv/bin/python bench/connections.py \\
        [--runs 5] [--requests 1000] [--concurrency 100] [--process web|celery]

Creates a throwaway database on the server DATABASE_URL points at (PostgreSQL only: SQLite has
no server connections), migrates it, starts the real ASGI server (Daphne, DEBUG off) in its
own process, and fires authenticated GETs at `/api/v1/sources` with an httpx async client.
During each run it samples pg_stat_activity for the server's connections; it prints per run
the peak, what is left after the burst, errors (5xx and transport failures) and throughput,
then median and range over the runs. The database is dropped at the end.

`--process web` (default) is how the web server runs: a psycopg pool of at most
DATABASE_POOL_MAX_SIZE connections. `--process celery` gives the server Celery's persistent
connections (CONN_MAX_AGE), which is what the web server had before: expect one connection per
request thread, and keep --concurrency low — it can exhaust a shared server's connections.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-var-"))
os.environ["DEBUG"] = "false"
os.environ.setdefault("REDIS_KEY_PREFIX", f"bench-{uuid.uuid4().hex[:12]}:")

APPLICATION_NAME = "cp-bench-server"
PATH = "/api/v1/sources"
ASGI_APP = "controlplane.asgi:application"


def _with_database(url: str, name: str, query: str = "") -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", query, ""))


def _admin_connect(url: str):
    import psycopg

    parts = urlsplit(url)
    return psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username,
        password=parts.password,
        dbname="postgres",
        autocommit=True,
        application_name="cp-bench-admin",
    )


def _count(conn, dbname: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
        (dbname, APPLICATION_NAME),
    ).fetchone()[0]


def _free_port() -> int:
    from controlplane.embedded.redis import free_port

    return free_port()


def _session_cookie() -> dict[str, str]:
    from django.conf import settings
    from django.test import Client

    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role

    user = create_user_with_role("bench-viewer", Role.VIEWER, uuid.uuid4().hex, validate=False)
    client = Client()
    client.force_login(user)
    return {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}


def _start_server(database_url: str, process: str) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    env = dict(os.environ, DATABASE_URL=database_url, CONTROLPLANE_PROCESS=process)
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), ASGI_APP],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/accounts/login/", timeout=2)
            return server, url
        except httpx.TransportError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise SystemExit("the ASGI server did not start") from None
            time.sleep(0.2)


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
        with _admin_connect(admin_url) as conn:
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
    with _admin_connect(admin_url) as conn:
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
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("DATABASE_URL must point at PostgreSQL: the bench counts its connections")
    dbname = f"bench_connections_{uuid.uuid4().hex[:8]}"
    with _admin_connect(base_url) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    os.environ["DATABASE_URL"] = _with_database(base_url, dbname)
    server = None
    try:
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", interactive=False, verbosity=0)
        cookies = _session_cookie()
        connections.close_all()
        server_url = _with_database(base_url, dbname, f"application_name={APPLICATION_NAME}")
        server, url = _start_server(server_url, args.process)
        how = (
            f"pool max {settings.DATABASE_POOL_MAX_SIZE}"
            if args.process == "web"
            else f"persistent, CONN_MAX_AGE {settings.DATABASE_CONN_MAX_AGE}"
        )
        print(
            f"{args.runs} runs of {args.requests} GET {PATH} at concurrency {args.concurrency}; "
            f"server connections: {how}; DEBUG off"
        )
        results = []
        for n in range(1, args.runs + 1):
            r = one_run(url, cookies, base_url, dbname, args.requests, args.concurrency)
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
        if server is not None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
        from django.db import connections

        connections.close_all()
        for conn in connections.all():
            if hasattr(conn, "close_pool"):
                conn.close_pool()
        with _admin_connect(base_url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


if __name__ == "__main__":
    main()
