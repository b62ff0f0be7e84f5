"""A fleet of `n` workers with a finished policy refresh, its serving ledger, published policies
and a canary analysis, for the query-count tests of the paths read and written per fleet
(`test_new_paths_flat.py`) and `bench/new_paths.py`.

The rows nobody under test writes (workers, the refresh's plan, results and journal) are
bulk-created as the executor would have left them (`tests/fixtures/scale.py` does the same
for pages); the serving ledger is written by its real writers (`refresh/gates.py` calling
`refresh/ledger.py`): discovery's `ensure_gates`, the refresh's `close_gates` and
`open_gates_verified`. So `write_ledger` is itself one of the measured paths.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core.signals import request_started
from django.db import connection, reset_queries
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source, Worker
from controlplane.refresh import gates
from controlplane.refresh.models import (
    JournalEntry,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
    StepRun,
    WorkerStepResult,
)
from controlplane.refresh.policy_lag import publish
from tests.fixtures.scale import make_fleet, step_rows

#: What every worker serves before the refresh (each fleet refreshes to a version of its own,
#: `Fleet.new`, so a version's trail at one size never includes another size's fleet).
OLD = "step-0"
#: The canary refresh's template (saved by `canary_refresh`).
TEMPLATE = "policy-drift"
ACTOR = Actor.system("scale fixture")


@contextlib.contextmanager
def captured() -> Iterator[CaptureQueriesContext]:
    """`CaptureQueriesContext` that counts whatever ran before it and across requests.

    The query log is a deque of at most `queries_limit` entries: once full (a 2,000-worker
    build fills it), its length stops moving and the context would capture nothing, at any
    fleet size. So the log is emptied first, and a capture that fills it is refused. Django
    also empties it when a request starts (`reset_queries` on `request_started`), which would
    drop what a request through the test client ran before it ended: that is switched off."""
    reset_queries()
    request_started.disconnect(reset_queries)
    try:
        with CaptureQueriesContext(connection) as queries:
            yield queries
    finally:
        request_started.connect(reset_queries)
    if len(queries.captured_queries) >= connection.queries_limit:
        raise AssertionError(f"more than {connection.queries_limit} statements: not counted")


def count(action: Callable[[], Any]) -> tuple[int, Any]:
    """The SQL statements `action` issues (and what it returns)."""
    with captured() as queries:
        result = action()
    return len(queries.captured_queries), result


@dataclass
class Fleet:
    source: Source
    size: int
    namespaces: list[str]
    #: (namespace, instance id, key) of every worker, in creation order.
    instances: list[tuple[str, str, str]]

    @property
    def new(self) -> str:
        """The version the fleet is refreshed to."""
        return f"v2-{self.source.name}"

    def by_namespace(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {ns: [] for ns in self.namespaces}
        for ns, iid, _ in self.instances:
            out[ns].append(iid)
        return out


def fleet(n: int, name: str = "") -> Fleet:
    source = Source.objects.create(
        name=name or f"scale-{n}",
        listener_url="http://127.0.0.1:9/",
        frontend_url="http://127.0.0.1:9/",
        allowed_networks=["10.0.0.0/8"],
    )
    make_fleet(source, n)
    # Every worker serves the old policy before the refresh (make_fleet mixes three).
    Worker.objects.filter(source=source).update(weight_version=OLD)
    rows = list(
        Worker.objects.filter(source=source)
        .order_by("pk")
        .values_list("namespace", "instance_id", "component", "endpoint")
    )
    instances = [(ns, iid, f"{ns}/{c}/{e}/{iid}") for ns, iid, c, e in rows]
    return Fleet(source, n, sorted({ns for ns, _, _ in instances}), instances)


def discovered(f: Fleet) -> None:
    """Discovery's fact: every instance seen at the version it declares (the gates appear,
    unverified)."""
    seen: dict[str, list[tuple[str, str, Any]]] = {ns: [] for ns in f.namespaces}
    for ns, iid, key in f.instances:
        seen[ns].append((iid, key, OLD))
    gates.ensure_gates(f.source, seen)


def finished_refresh(f: Fleet, *, version: str = "", **fields) -> PolicyRefresh:
    """A refresh of the whole fleet to `version` whose every worker paused, updated, resumed
    and verified, each call journaled (as the executor leaves it before the reopen)."""
    now = timezone.now()
    version = version or f.new
    refresh = PolicyRefresh.objects.create(
        source=f.source,
        namespaces=f.namespaces,
        target={"weight_version": version, "method": "disk", "model_path": f"/ckpt/{version}"},
        verification={"version_readback": True, "liveness": True},
        state=fields.pop("state", RefreshState.REOPENING),
        started_at=now,
        lease_token=1,
        **fields,
    )
    workers = dict(Worker.objects.filter(source=f.source).values_list("instance_id", "pk"))
    planned = PlannedWorker.objects.bulk_create(
        (
            PlannedWorker(
                refresh=refresh,
                worker_id=workers[iid],
                key=key,
                namespace=ns,
                instance_id=iid,
                system_url=f"http://10.0.{i // 250}.{i % 250}:9000",
                family="vllm",
                model=f"model-{i % 2}",
                calls={},
                wave=2 if refresh.waves > 1 and i % 10 else 1,
            )
            for i, (ns, iid, key) in enumerate(f.instances)
        ),
        batch_size=1000,
    )
    StepRun.objects.bulk_create(
        StepRun(refresh=refresh, name=step, status="ok", started_at=now, finished_at=now)
        for step in ("gate", "resolve", "pause", "update", "resume", "verify")
    )
    results, calls = [], []
    for pw in planned:
        if pw.wave != refresh.wave:
            continue
        for step, operation in (
            ("pause", "pause"),
            ("update", "update_from_disk"),
            ("resume", "resume"),
            ("verify", "weight_version"),
        ):
            result, call = step_rows(
                refresh,
                pw,
                step,
                operation=operation,
                method="POST" if step != "verify" else "GET",
                url=f"{pw.system_url}/engine/{operation}",
                at=now,
                response_body={"status": "ok", "weight_version": version},
            )
            results.append(result)
            calls.append(call)
    WorkerStepResult.objects.bulk_create(results, batch_size=2000)
    JournalEntry.objects.bulk_create(calls, batch_size=2000)
    return refresh


def close(refresh: PolicyRefresh) -> None:
    """The refresh's gate step: the ledger withdraws every instance, in transition."""
    gates.close_gates(refresh, actor=ACTOR, reason=f"policy refresh #{refresh.pk}")


def reopen(f: Fleet, refresh: PolicyRefresh) -> None:
    """The refresh's reopen: every instance verified at its version and admitted."""
    gates.open_gates_verified(refresh, actor=ACTOR, verified=f.by_namespace())


def published(f: Fleet, steps: int = 3) -> None:
    """The trainer published the old policy, two more steps, then the new one."""
    start = timezone.now() - timedelta(minutes=10)
    versions = [OLD, *(f"step-{k}" for k in range(1, steps)), f.new]
    for step, version in enumerate(versions):
        publish(
            f.source,
            step=step * 100,
            version=version,
            published_at=start + timedelta(minutes=step),
            event_type="policy.published",
        )
