"""Capacity of one refresh, timed: prints figures, asserts nothing.

    .venv/bin/python bench/capacity.py [--workers 2000] [--runs 15]

Writes one finished refresh of N workers across three namespaces as the executor would (a
pause, an update, a flush, a resume and two verify calls per worker, each namespace's gate
closed and reopened with its audit rows), then times `capacity_of` (the computation and its
four queries), the page's section computed (`capacity_chart._view`: computation and SVG)
and shared from the cache (`capacity_chart.view`, a finished refresh), and the API's JSON,
printing median and range over the runs and the query count. Uses a throwaway SQLite database
unless DATABASE_URL is set; the cache is REDIS_URL's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-var-"))
if not os.environ.get("DATABASE_URL"):
    os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix='bench-db-')}/bench.sqlite3"

NAMESPACES = ("rl-a", "rl-b", "rl-c")
CALLS = (  # (step, operation, seconds after the start, spread over the workers)
    ("pause", "pause", 1.0, 0.5),
    ("update", "update_from_disk", 3.0, 2.0),
    ("flush", "flush_cache", 6.0, 0.3),
    ("resume_engines", "resume", 7.0, 0.5),
    ("verify", "get_weight_version", 8.0, 0.3),
    ("verify", "liveness", 8.5, 0.3),
)


def fill(workers: int):
    import datetime as dt

    from django.utils import timezone

    from controlplane.audit.actions import AuditAction
    from controlplane.audit.recorder import Actor, record
    from controlplane.bulk import insert_values
    from controlplane.fleet.models import Source
    from controlplane.refresh.executor.journal import JOURNAL_FIELDS
    from controlplane.refresh.models import (
        Gate,
        JournalEntry,
        PlannedWorker,
        PolicyRefresh,
        RefreshState,
    )

    t0 = timezone.now() - dt.timedelta(minutes=10)
    source = Source.objects.create(
        name=f"bench-{workers}-{int(time.time())}",
        listener_url="http://127.0.0.1:9/",
        allowed_networks=["127.0.0.0/8"],
    )
    refresh = PolicyRefresh.objects.create(
        source=source,
        namespaces=list(NAMESPACES),
        target={"weight_version": "v2", "method": "disk", "model_path": "/m"},
        state=RefreshState.SUCCEEDED,
        started_at=t0,
        finished_at=t0 + dt.timedelta(seconds=12),
    )
    PlannedWorker.objects.bulk_create(
        PlannedWorker(
            refresh=refresh,
            key=f"{NAMESPACES[i % 3]}/backend/generate/{i}",
            namespace=NAMESPACES[i % 3],
            instance_id=str(i),
        )
        for i in range(workers)
    )
    ids = list(PlannedWorker.objects.filter(refresh=refresh).values_list("pk", flat=True))
    rows = []
    for i, pk in enumerate(ids):
        for step, operation, at, spread in CALLS:
            when = t0 + dt.timedelta(seconds=at + spread * i / workers)
            call = (step, operation, "POST", "http://w/", None, 200, None, True, "", 5.0, 1)
            rows.append((refresh.pk, pk, *call, when, when, 1, False, None))
    insert_values(JournalEntry, JOURNAL_FIELDS, rows)
    actor = Actor.system("capacity bench")
    for namespace in NAMESPACES:
        gate = Gate.objects.create(source=source, namespace=namespace, verified_version="v1")
        for action, state in (
            (AuditAction.GATE_CLOSED, "closed"),
            (AuditAction.GATE_OPENED, "open"),
        ):
            record(
                action, actor=actor, target=gate, details={"state": state, "verified_version": "v1"}
            )
    # The audit rows are stamped now; move the refresh's window over them.
    PolicyRefresh.objects.filter(pk=refresh.pk).update(
        started_at=timezone.now() - dt.timedelta(seconds=1),
        finished_at=timezone.now() + dt.timedelta(seconds=12),
    )
    refresh.refresh_from_db()
    return refresh, len(rows)


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def line(name: str, ms: list[float]) -> str:
    return (
        f"  {name:<34} median {statistics.median(ms):7.1f} ms  "
        f"range {min(ms):.1f} to {max(ms):.1f} ms  ({len(ms)} runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.refresh import capacity_chart
    from controlplane.refresh.capacity import capacity_of

    call_command("migrate", verbosity=0)
    refresh, calls = fill(args.workers)
    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    with CaptureQueriesContext(connection) as queries:
        cap = capacity_of(refresh)
    assert cap is not None
    print(
        f"capacity bench: {args.workers} workers, {calls} journal rows ({engine}); "
        f"{len(cap.points)} changes, {len(queries.captured_queries)} queries"
    )
    print(line("capacity_of (4 queries + compute)", timed(lambda: capacity_of(refresh), args.runs)))
    print(
        line(
            "page section, computed (+ SVG)",
            timed(lambda: capacity_chart._view(refresh), args.runs),
        )
    )
    # What each viewer pays once one computed it: a finished refresh's section is cached.
    capacity_chart.view(refresh)
    print(
        line("page section, shared (cache)", timed(lambda: capacity_chart.view(refresh), args.runs))
    )
    print(
        line(
            "API JSON, first page of 50 workers (compute + serialise)",
            timed(lambda: json.dumps(capacity_of(refresh).as_dict(slice(0, 50))), args.runs),
        )
    )
    svg = capacity_chart.view(refresh).chart
    answer = json.dumps(cap.as_dict(slice(0, 50)))
    print(f"  chart: {len(svg) / 1024:.1f} KiB of SVG; API answer {len(answer) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
