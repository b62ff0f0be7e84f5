"""The big pages at fleet scale: prints figures, asserts nothing.

    DATABASE_URL=postgres://... .venv/bin/python bench/pages.py [--workers 2000] [--runs 7]

Creates a throwaway PostgreSQL database on the server DATABASE_URL points at, migrates it, and
writes in bulk a source of N workers (4 namespaces, 3 versions, a full membership timeline) and
a policy refresh of N workers in the middle of its update step (every call journaled with its
bodies). Then, with DEBUG off, a signed-in viewer requests the source page and the refresh page
alternately, `--runs` times each after one warm-up, through Django's full middleware stack
(sessions, auth, CSP) in this process: server time, bytes of HTML, and SQL queries (counted on a
separate untimed request). Prints median and range per page against the limits (150 ms, 250 KB
for the first screen), then one summary line. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-var-"))
os.environ["DEBUG"] = "false"

LIMIT_MS = 150.0
LIMIT_BYTES = 250_000


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
    )


def _fill(workers: int) -> tuple[str, str]:
    """The source and refresh pages' URLs, over N workers each."""
    from django.urls import reverse

    from controlplane.fleet.live import TIMELINE_LIMIT
    from tests.fixtures.scale import make_events, make_fleet, make_refresh, make_source

    source = make_source("bench", actor="bench", expected_prefix="rl")
    make_fleet(source, workers)
    make_events(source, TIMELINE_LIMIT)
    refresh = make_refresh(source, workers)
    return reverse("fleet:source", args=[source.pk]), reverse("refresh:detail", args=[refresh.pk])


def _profile(client, url: str) -> dict:
    """Warm up (templates compiled, caches filled), then the page's bytes and SQL queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url)
    with CaptureQueriesContext(connection) as queries:
        size = len(client.get(url).content)
    return {"ms": [], "cpu": [], "bytes": size, "queries": len(queries.captured_queries)}


def _time(client, url: str) -> tuple[float, float]:
    """Wall and process CPU milliseconds of one request (CPU: less at the mercy of a busy
    machine; it leaves out the database server's own time)."""
    t0, c0 = time.perf_counter(), time.process_time()
    response = client.get(url)
    elapsed, cpu = (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000
    assert response.status_code == 200, (url, response.status_code)
    return elapsed, cpu


def _line(name: str, m: dict) -> str:
    ms = m["ms"]
    time_ok = statistics.median(ms) < LIMIT_MS
    size_ok = m["bytes"] < LIMIT_BYTES
    return (
        f"{name:<13} median {statistics.median(ms):6.1f} ms (range {min(ms):.1f}-{max(ms):.1f}, "
        f"limit {LIMIT_MS:.0f}: {'met' if time_ok else 'NOT met'}) · CPU median "
        f"{statistics.median(m['cpu']):.1f} ms (range {min(m['cpu']):.1f}-{max(m['cpu']):.1f}) · "
        f"{m['bytes'] / 1000:.1f} KB (limit {LIMIT_BYTES / 1000:.0f}: "
        f"{'met' if size_ok else 'NOT met'}) · {m['queries']} queries"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        sys.exit("bench/pages.py measures on PostgreSQL: set DATABASE_URL=postgres://...")
    if args.runs < 5:
        sys.exit("--runs must be at least 5 (median and range of >= 5 runs)")

    dbname = f"bench_pages_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(base)
    os.environ["DATABASE_URL"] = urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", "", ""))
    with _admin_connect(base) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        import django
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connections

        django.setup()
        assert not settings.DEBUG
        call_command("migrate", verbosity=0)
        from django.test import Client

        from controlplane.accounts.roles import Role
        from controlplane.accounts.services import create_user_with_role

        source_url, refresh_url = _fill(args.workers)
        viewer = create_user_with_role(
            "bench-viewer", Role.VIEWER, uuid.uuid4().hex, validate=False
        )
        client = Client()
        client.force_login(viewer)
        # Alternate the two pages run by run, so both see the same machine load.
        pages = {"source page": source_url, "refresh page": refresh_url}
        results = {name: _profile(client, url) for name, url in pages.items()}
        for _ in range(args.runs):
            for name, url in pages.items():
                wall, cpu = _time(client, url)
                results[name]["ms"].append(wall)
                results[name]["cpu"].append(cpu)
        load = os.getloadavg()[0]
        print(
            f"{args.workers} workers, {args.runs} runs each, DEBUG off, PostgreSQL, "
            f"load average {load:.1f} on {os.cpu_count()} CPUs"
        )
        for name, m in results.items():
            print(_line(name, m))
        verdict = all(
            statistics.median(m["ms"]) < LIMIT_MS and m["bytes"] < LIMIT_BYTES
            for m in results.values()
        )
        s, r = results["source page"], results["refresh page"]
        print(
            f"pages @ {args.workers} workers: source {statistics.median(s['ms']):.1f} ms "
            f"{s['bytes'] / 1000:.0f} KB, refresh {statistics.median(r['ms']):.1f} ms "
            f"{r['bytes'] / 1000:.0f} KB (median wall; limits {LIMIT_MS:.0f} ms, "
            f"{LIMIT_BYTES / 1000:.0f} KB): "
            f"{'met' if verdict else 'NOT met'}"
        )
        connections.close_all()
    finally:
        with _admin_connect(base) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


if __name__ == "__main__":
    main()
