"""The database half of a discovery refresh: upsert by identity, diff, history rows.

Query count is constant in the number of workers: one SELECT of the source's workers, one
bulk INSERT for newcomers (plus one SELECT reading back their keys), one bulk UPDATE for rows
that look different, one UPDATE stamping everyone still present, one bulk INSERT of events.
A steady fleet touches almost nothing. (Batches of `BATCH` rows each.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.bulk import insert_objects, insert_values
from controlplane.dynamo.discovery import worker_key
from controlplane.fleet.discovery.diff import MembershipDiff, Snapshot, diff_membership
from controlplane.fleet.discovery.observe import Observation
from controlplane.fleet.models import (
    DiscoveryRun,
    Liveness,
    Source,
    Worker,
    WorkerEvent,
    WorkerState,
)

#: Columns a refresh may rewrite on an existing row.
REFRESHED_FIELDS = [
    "family",
    "transport",
    "request_plane_url",
    "system_url",
    "admin_base_url",
    "model",
    "routes",
    "world_size",
    "error",
    "state",
    "weight_version",
    "weight_version_declared",
    "version_error",
    "liveness",
    "liveness_error",
    "gone_at",
    "static_worker",
]
BATCH = 500


@dataclass
class StoredRefresh:
    diff: MembershipDiff
    workers_by_key: dict[str, Worker]
    total: int
    live: int
    erroring: int


def _row_snapshot(w: Worker) -> Snapshot:
    return Snapshot(
        routes=tuple(w.routes or ()),
        system_url=w.system_url,
        model=w.model,
        world_size=w.world_size,
        error=w.error,
        gone=w.state == WorkerState.GONE,
        weight_version=w.weight_version,
        version_known=w.version_probed_at is not None and not w.version_error,
        liveness=w.liveness,
    )


def _obs_snapshot(o: Observation) -> Snapshot:
    return Snapshot(
        routes=tuple(o.routes),
        system_url=o.system_url,
        model=o.model,
        world_size=o.world_size,
        error=o.error,
        weight_version=o.weight_version,
        version_known=o.version_ok,
        liveness=o.liveness,
    )


def _row_values(w: Worker) -> tuple:
    return tuple(
        getattr(w, f if f != "static_worker" else "static_worker_id") for f in REFRESHED_FIELDS
    )


def _apply(w: Worker, o: Observation, now: datetime) -> None:
    """Write an observation onto a row (new or existing). Versions survive a failed probe.

    `version_probed_at` is set here only for new rows; existing rows get it from one UPDATE in
    `store_observation`, so an unchanged fleet does not rewrite every row each refresh.
    """
    w.family = o.family
    w.transport = o.transport
    w.request_plane_url = o.request_plane_url
    w.system_url = o.system_url
    w.admin_base_url = o.admin_base_url
    w.model = o.model
    w.routes = list(o.routes)
    w.world_size = o.world_size
    w.error = o.error
    w.state = WorkerState.ERRORING if o.error else WorkerState.LIVE
    w.gone_at = None
    w.static_worker_id = o.static_worker_id
    if o.version_ok:
        w.weight_version = o.weight_version
        w.weight_version_declared = o.weight_version_declared
        w.version_error = ""
        if w.pk is None:
            w.version_probed_at = now
    elif o.version_probed:
        w.version_error = o.version_error
    else:
        w.version_error = ""
    w.liveness = o.liveness if o.liveness in Liveness.values else Liveness.UNKNOWN
    w.liveness_error = o.liveness_error


def _read_back_pks(source: Source, created: list[Worker]) -> None:
    """Give workers inserted by `insert_objects` their primary keys (one SELECT of identity
    columns, so the query count stays constant)."""
    wanted = {w.key: w for w in created}
    rows = Worker.objects.filter(source=source).values_list(
        "pk", "namespace", "component", "endpoint", "instance_id"
    )
    for pk, namespace, component, endpoint, instance_id in rows:
        row = wanted.get(worker_key(namespace, component, endpoint, instance_id))
        if row is not None:
            row.pk = pk
    missing = [k for k, w in wanted.items() if w.pk is None]
    if missing:  # the unique identity constraint makes this impossible; never guess a pk
        raise RuntimeError(f"inserted workers not found: {missing[:5]}")


def store_observation(
    source: Source, observed: list[Observation], run: DiscoveryRun, now: datetime
) -> StoredRefresh:
    """Upsert workers, mark the missing ones gone, and record the diff as events."""
    existing = {w.key: w for w in Worker.objects.filter(source=source)}
    by_key = {o.key: o for o in observed}
    diff = diff_membership(
        {k: _row_snapshot(w) for k, w in existing.items()},
        {k: _obs_snapshot(o) for k, o in by_key.items()},
    )

    created: list[Worker] = []
    updated: list[Worker] = []
    for key, o in by_key.items():
        row = existing.get(key)
        if row is None:
            row = Worker(
                source=source,
                namespace=o.namespace,
                component=o.component,
                endpoint=o.endpoint,
                instance_id=o.instance_id,
                first_seen_at=now,
                last_seen_at=now,
                last_probed_at=now,
            )
            _apply(row, o, now)
            created.append(row)
            existing[key] = row
            continue
        before = _row_values(row)
        _apply(row, o, now)
        if _row_values(row) != before:
            updated.append(row)
    for key in diff.left:
        row = existing[key]
        row.state = WorkerState.GONE
        row.gone_at = now
        updated.append(row)

    if created:
        insert_objects(Worker, created)
        _read_back_pks(source, created)
    if updated:
        Worker.objects.bulk_update(updated, REFRESHED_FIELDS, batch_size=BATCH)
    # One statement stamps everyone still present instead of rewriting 2,000 rows.
    Worker.objects.filter(source=source).exclude(state=WorkerState.GONE).update(
        last_seen_at=now, last_probed_at=now
    )
    # New rows were inserted with `version_probed_at` already set (see `_apply`).
    new_keys = {w.key for w in created}
    version_read = [existing[o.key].pk for o in observed if o.version_ok and o.key not in new_keys]
    for start in range(0, len(version_read), BATCH):
        Worker.objects.filter(pk__in=version_read[start : start + BATCH]).update(
            version_probed_at=now
        )
    for row in existing.values():
        if row.key in by_key and by_key[row.key].version_ok:
            row.version_probed_at = now
    # Plain rows: a cold refresh records one event per joining worker, and nothing reads
    # the event instances back.
    insert_values(
        WorkerEvent,
        ("source", "worker", "run", "occurred_at", "kind", "details"),
        ((source.pk, existing[c.key].pk, run.pk, now, c.kind, c.details) for c in diff.changes()),
    )
    erroring = sum(1 for o in observed if o.error)
    return StoredRefresh(diff, existing, len(observed), len(observed) - erroring, erroring)
