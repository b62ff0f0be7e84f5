"""Paired measurement for the benches: our path and a bare client, alternating in one process.

Each repetition runs both, in alternating order (ours first on even repetitions, the bare client
first on odd ones), so a slow spell of a busy machine hits both about equally. For each run it
records wall time, this process's CPU time (every thread: the event loop threads count), the SQL
statements our path issued (counted by an execute wrapper, so COPY counts as one) and the time
spent in `realtime.publish` (measured apart, since publishing is being replaced by a
long-lived publisher and its cost should stay visible on its own).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

#: Modules that imported `publish` by name (their copy is what callers use).
PUBLISH_USERS = (
    "controlplane.realtime",
    "controlplane.refresh.live",
    "controlplane.fleet.live",
)


def bench_environment() -> None:
    """Settings every bench shares: DEBUG off (the query log and SQLite re-quoting would be
    measured otherwise), a throwaway SQLite database unless DATABASE_URL names one."""
    import tempfile

    os.environ["DEBUG"] = "false"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-var-"))
    if not os.environ.get("DATABASE_URL"):
        db_dir = tempfile.mkdtemp(prefix="bench-db-")
        os.environ["DATABASE_URL"] = f"sqlite:///{db_dir}/bench.sqlite3"


def setup_django() -> None:
    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    assert not settings.DEBUG, "benches run with DEBUG off"
    call_command("migrate", verbosity=0)


@dataclass
class Run:
    wall: float
    cpu: float
    sql: int = 0
    publish: float = 0.0
    publish_cpu: float = 0.0
    publishes: int = 0
    #: The part of `cpu` spent in the kernel (sockets, the database's wire): what a profile of
    #: the Python stacks does not show.
    system: float = 0.0


@dataclass
class Counters:
    sql: int = 0
    publish: float = 0.0
    #: Process CPU while a publish ran (it runs on a thread of its own, so this includes
    #: whatever the call threads did meanwhile: an upper bound).
    publish_cpu: float = 0.0
    publishes: int = 0
    #: Statements by their first `SQL_SHAPE_CHARS` characters (with `BENCH_SQL_BREAKDOWN=1`).
    statements: collections.Counter[str] = field(default_factory=collections.Counter)


#: `BENCH_SQL_BREAKDOWN=1` prints, after the table, the statements of our last run grouped by
#: how they start: which of them grow with the fleet or the run's length.
BREAKDOWN = os.environ.get("BENCH_SQL_BREAKDOWN") == "1"
SQL_SHAPE_CHARS = 90
#: The breakdown of the last counted run.
LAST_STATEMENTS: collections.Counter[str] = collections.Counter()


@contextlib.contextmanager
def counting() -> Iterator[Counters]:
    """Count SQL statements on this thread's connection and time every `realtime.publish`."""
    from django.db import connection

    counters = Counters()

    def count_sql(execute, sql, params, many, context):
        counters.sql += 1
        if BREAKDOWN:
            counters.statements[" ".join(sql.split())[:SQL_SHAPE_CHARS]] += 1
        return execute(sql, params, many, context)

    originals = {}
    for name in PUBLISH_USERS:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "publish"):
            originals[name] = module.publish

    def timed(original):
        def publish(*args, **kwargs):
            t0, cpu0 = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                counters.publish += time.perf_counter() - t0
                counters.publish_cpu += time.process_time() - cpu0
                counters.publishes += 1

        return publish

    for name, original in originals.items():
        sys.modules[name].publish = timed(original)  # type: ignore[attr-defined]
    try:
        with connection.execute_wrapper(count_sql):
            yield counters
    finally:
        for name, original in originals.items():
            sys.modules[name].publish = original  # type: ignore[attr-defined]


def measure(fn: Callable[[], object], *, count: bool) -> tuple[Run, object]:
    if count:
        with counting() as counters:
            sys0, cpu0, t0 = os.times().system, time.process_time(), time.perf_counter()
            value = fn()
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            system = os.times().system - sys0
        run = Run(wall, cpu, counters.sql, counters.publish, counters.publish_cpu, system=system)
        run.publishes = counters.publishes
        LAST_STATEMENTS.clear()
        LAST_STATEMENTS.update(counters.statements)
        return run, value
    sys0, cpu0, t0 = os.times().system, time.process_time(), time.perf_counter()
    value = fn()
    run = Run(time.perf_counter() - t0, time.process_time() - cpu0)
    run.system = os.times().system - sys0
    return run, value


@dataclass
class Pairs:
    ours: list[Run] = field(default_factory=list)
    bare: list[Run] = field(default_factory=list)


def alternate(
    repetitions: int,
    prepare: Callable[[int], object],
    ours: Callable[[object], object],
    bare: Callable[[object], object],
) -> Pairs:
    """`repetitions` pairs; `prepare(i)` (untimed) makes what both runs of pair i need."""
    pairs = Pairs()
    for i in range(repetitions):
        context = prepare(i)
        order = ("ours", "bare") if i % 2 == 0 else ("bare", "ours")
        for which in order:
            if which == "ours":
                run, _ = measure(functools.partial(ours, context), count=True)
                pairs.ours.append(run)
            else:
                run, _ = measure(functools.partial(bare, context), count=False)
                pairs.bare.append(run)
        print(
            f"  pair {i + 1}/{repetitions} ({' then '.join(order)}): ours "
            f"{pairs.ours[-1].wall * 1000:7.0f} ms wall {pairs.ours[-1].cpu * 1000:7.0f} ms CPU"
            f" | bare {pairs.bare[-1].wall * 1000:7.0f} ms wall "
            f"{pairs.bare[-1].cpu * 1000:7.0f} ms CPU",
            flush=True,
        )
    return pairs


def spread(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{min(ms):7.0f} {statistics.median(ms):7.0f} {max(ms):7.0f}"


def report(title: str, pairs: Pairs, *, ideal: float, targets: tuple[float, float]) -> None:
    """The table (min/median/max of wall and CPU for both, the ideal, SQL and publish per run)
    and one summary line with the ratios (median over pairs of ours ÷ bare)."""
    print(f"\n{'':24} {'wall ms: min  median    max':>27}   {'CPU ms: min  median    max':>27}")
    for label, runs in (("ours", pairs.ours), ("bare aiohttp", pairs.bare)):
        print(f"{label:24} {spread([r.wall for r in runs])}   {spread([r.cpu for r in runs])}")
    print(f"{'ideal (calls x latency / concurrency)':40} {ideal * 1000:7.0f}")
    for label, runs in (("ours", pairs.ours), ("bare aiohttp", pairs.bare)):
        print(f"{'of the CPU, in the kernel: ' + label:40} {spread([r.system for r in runs])}")
    sql = [r.sql for r in pairs.ours]
    print(f"SQL statements per run (ours): {sorted(sql)}")
    if BREAKDOWN:
        print("statements of our last run, by how they start:")
        for shape, n in LAST_STATEMENTS.most_common():
            print(f"  {n:5} {shape}")
    print(
        "publish per run (ours, realtime.publish; wall ms / CPU ms / publishes): "
        + ", ".join(
            f"{r.publish * 1000:.0f}/{r.publish_cpu * 1000:.0f}/{r.publishes}" for r in pairs.ours
        )
    )
    paired = list(zip(pairs.ours, pairs.bare, strict=True))
    wall_ratio = statistics.median(o.wall / b.wall for o, b in paired)
    cpu_ratio = statistics.median(o.cpu / b.cpu for o, b in paired)
    publish = statistics.median(r.publish for r in pairs.ours)
    no_publish = statistics.median((o.wall - o.publish) / b.wall for o, b in paired)
    no_publish_cpu = statistics.median((o.cpu - o.publish_cpu) / b.cpu for o, b in paired)
    wall_target, cpu_target = targets
    print(
        f"\nSUMMARY {title}: wall ratio {wall_ratio:.2f} (target <= {wall_target:g}), "
        f"CPU ratio {cpu_ratio:.2f} (target <= {cpu_target:g}), over {len(pairs.ours)} pairs; "
        f"publish {publish * 1000:.0f} ms/run; without publishing: wall ratio "
        f"{no_publish:.2f}, CPU ratio {no_publish_cpu:.2f}"
    )
