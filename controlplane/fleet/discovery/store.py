"""The database half of a discovery refresh: upsert by identity, diff, history rows.

Query count is constant in the number of workers: one SELECT of the source's workers, one
bulk INSERT for newcomers (plus one SELECT: on PostgreSQL reserving their ids beforehand,
elsewhere reading back their keys), one UPDATE per group of rows that changed alike (at
most `SHARED_CHANGES`, see `_Changes`) and one bulk UPDATE for rows that changed otherwise,
one UPDATE stamping everyone still present, one bulk INSERT of events.
A steady fleet touches almost nothing. (Batches of `BATCH` rows each.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.bulk import insert_values, reserve_ids
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
    "identity_note",
]
BATCH = 500


#: A row as read for the refresh: pk, identity, `version_probed_at`, then REFRESHED_FIELDS.
ROW_COLUMNS = [
    "pk",
    "namespace",
    "component",
    "endpoint",
    "instance_id",
    "version_probed_at",
    *(f if f != "static_worker" else "static_worker_id" for f in REFRESHED_FIELDS),
]
_HEAD = 6  # columns before the refreshed ones
_LIVENESS = frozenset(Liveness.values)
#: The details of an event that has none, one object for every such row so the COPY
#: serialises it once (never mutated).
_NO_DETAILS: dict = {}
_F = {name: _HEAD + i for i, name in enumerate(REFRESHED_FIELDS)}


@dataclass
class StoredRefresh:
    diff: MembershipDiff
    #: Primary key of every worker row the refresh knows (present and gone), by worker key.
    pks: dict[str, int]
    total: int
    live: int
    erroring: int


def _row_snapshot(row: tuple) -> Snapshot:
    return Snapshot(
        routes=tuple(row[_F["routes"]] or ()),
        system_url=row[_F["system_url"]],
        model=row[_F["model"]],
        world_size=row[_F["world_size"]],
        error=row[_F["error"]],
        gone=row[_F["state"]] == WorkerState.GONE,
        weight_version=row[_F["weight_version"]],
        version_known=row[5] is not None and not row[_F["version_error"]],
        liveness=row[_F["liveness"]],
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


#: What the diff needs of a joining worker that is not erroring (see `_snapshot_against`).
_JOINING = Snapshot()


def _snapshot_against(old: Snapshot | None, o: Observation) -> Snapshot:
    """The observation's snapshot for the diff. A worker with no row, or a gone one, joins,
    and `diff_membership` then reads nothing of it but its error: one shared snapshot
    stands for every such worker that is not erroring, so a cold refresh builds none per
    worker (a test runs the diff on both kinds of snapshot and requires the same result)."""
    if old is None or old.gone:
        return Snapshot(error=o.error) if o.error else _JOINING
    return _obs_snapshot(o)


def _refreshed(o: Observation, weight_version, declared: bool, lists: dict) -> tuple:
    """REFRESHED_FIELDS of a row after this observation (`weight_version` and `declared`: the
    row's own, which survive a failed probe). A row that is not gone leaves `gone`.

    `lists` holds one list per distinct route set for the refresh: rows with the same routes
    share it, so the bulk insert serialises it once (`bulk` remembers JSON by identity)."""
    routes = lists.get(o.routes)
    if routes is None:
        routes = lists[o.routes] = list(o.routes)
    if o.version_ok:
        weight_version, declared, version_error = o.weight_version, o.weight_version_declared, ""
    else:
        version_error = o.version_error if o.version_probed else ""
    return (
        o.family,
        o.transport,
        o.request_plane_url,
        o.system_url,
        o.admin_base_url,
        o.model,
        routes,
        o.world_size,
        o.error,
        WorkerState.ERRORING if o.error else WorkerState.LIVE,
        weight_version,
        declared,
        version_error,
        o.liveness if o.liveness in _LIVENESS else Liveness.UNKNOWN,
        o.liveness_error,
        None,
        o.static_worker_id,
        o.identity_note,
    )


#: Columns of a row inserted by a refresh, before REFRESHED_FIELDS (every column: plain
#: inserts apply no model defaults).
NEW_ROW_HEAD = (
    "source",
    "namespace",
    "component",
    "endpoint",
    "instance_id",
    "first_seen_at",
    "last_seen_at",
    "last_probed_at",
    "version_probed_at",
)


def _new_row(source: Source, o: Observation, now: datetime, lists: dict) -> tuple:
    """A joining worker's row, in NEW_ROW_HEAD + REFRESHED_FIELDS order. Existing rows get
    `version_probed_at` from the stamping UPDATE in `store_observation`."""
    return (
        source.pk,
        o.namespace,
        o.component,
        o.endpoint,
        o.instance_id,
        now,
        now,
        now,
        now if o.version_ok else None,
        *_refreshed(o, None, False, lists),
    )


def _changed_row(pk: int, values: tuple) -> Worker:
    """A row to rewrite with `bulk_update` (only REFRESHED_FIELDS are written)."""
    fields = dict(zip(REFRESHED_FIELDS, values, strict=True))
    fields["static_worker_id"] = fields.pop("static_worker")
    return Worker(pk=pk, **fields)


#: Attribute names of REFRESHED_FIELDS, for `QuerySet.update`.
_ATTNAMES = [f if f != "static_worker" else "static_worker_id" for f in REFRESHED_FIELDS]
#: At most this many groups of rows changed alike are written with plain UPDATEs.
SHARED_CHANGES = 4


class _Changes:
    """Existing rows whose refreshed columns differ, grouped by which columns changed to what.

    After a policy refresh every worker changes the same way (its weight version), and
    `bulk_update` builds a CASE per row and column in Python: ~3 s of CPU for 500 rows, in the
    discovery every trainer's checkpoint waits for (the plan's). Rows changed alike are written
    with one `UPDATE ... WHERE id IN (...)` of only the changed columns; the SHARED_CHANGES
    largest such groups go that way and the rest (rows each changed their own way) keep
    `bulk_update`, so the statements stay bounded whatever changed."""

    def __init__(self) -> None:
        self.groups: dict[tuple | None, list[tuple[int, tuple]]] = {}

    def add(self, pk: int, old: tuple, new: tuple) -> None:
        try:
            key: tuple | None = tuple(
                (i, tuple(v) if isinstance(v, list) else v)
                for i, (was, v) in enumerate(zip(old, new, strict=True))
                if was != v
            )
            hash(key)
        except TypeError:  # a value that cannot key a group is written row by row
            key = None
        self.groups.setdefault(key, []).append((pk, new))

    def write(self) -> None:
        alike = sorted(
            (k for k, rows in self.groups.items() if k is not None and len(rows) > 1),
            key=lambda k: len(self.groups[k]),
            reverse=True,
        )[:SHARED_CHANGES]
        for key in alike:
            rows = self.groups[key]
            first = rows[0][1]
            columns = {_ATTNAMES[i]: first[i] for i, _ in key}
            pks = [pk for pk, _ in rows]
            for start in range(0, len(pks), BATCH):
                Worker.objects.filter(pk__in=pks[start : start + BATCH]).update(**columns)
        shared = set(alike)
        rest = [
            _changed_row(pk, values)
            for key, rows in self.groups.items()
            if key not in shared
            for pk, values in rows
        ]
        if rest:
            Worker.objects.bulk_update(rest, REFRESHED_FIELDS, batch_size=BATCH)


def _read_back_pks(source: Source, created: list[str], pks: dict[str, int]) -> None:
    """Give the workers just inserted (by key) their primary keys (one SELECT of identity
    columns, so the query count stays constant)."""
    wanted = set(created)
    rows = Worker.objects.filter(source=source).values_list(
        "pk", "namespace", "component", "endpoint", "instance_id"
    )
    for pk, namespace, component, endpoint, instance_id in rows:
        key = worker_key(namespace, component, endpoint, instance_id)
        if key in wanted:
            pks[key] = pk
    missing = [k for k in created if k not in pks]
    if missing:  # the unique identity constraint makes this impossible; never guess a pk
        raise RuntimeError(f"inserted workers not found: {missing[:5]}")


def _insert_new(source: Source, created: list[str], rows: list[tuple], pks: dict) -> None:
    """Insert the joining workers' rows and give their keys primary keys. On PostgreSQL the
    ids are drawn from the table's sequence first and inserted with the rows, so nothing is
    read back (a cold refresh of 2,000 workers would otherwise re-read 2,000 identities and
    rebuild their keys); elsewhere the rows are read back by identity."""
    ids = reserve_ids(Worker, len(rows))
    if ids is None:
        insert_values(Worker, (*NEW_ROW_HEAD, *REFRESHED_FIELDS), rows)
        _read_back_pks(source, created, pks)
        return
    insert_values(
        Worker,
        ("id", *NEW_ROW_HEAD, *REFRESHED_FIELDS),
        ((pk, *row) for pk, row in zip(ids, rows, strict=True)),
    )
    pks.update(zip(created, ids, strict=True))


def _stamp(source: Source, observed: list[Observation], pks: dict[str, int], now) -> None:
    """Stamp every worker still present as seen and probed, and as version-read where its
    version probe answered: one UPDATE when every version was read (the usual refresh), two
    when few were not, else one per `BATCH` read rows. Rows inserted by this refresh already
    carry all three stamps (see `_new_row`) and are left alone: they hold `now` exactly, so
    a refresh where every worker joins rewrites none of its rows a second time."""
    present = (
        Worker.objects.filter(source=source)
        .exclude(state=WorkerState.GONE)
        .exclude(last_seen_at=now)
    )
    unread = [pks[o.key] for o in observed if not o.version_ok]
    if len(unread) <= BATCH:
        if unread:
            present.filter(pk__in=unread).update(last_seen_at=now, last_probed_at=now)
            present = present.exclude(pk__in=unread)
        present.update(last_seen_at=now, last_probed_at=now, version_probed_at=now)
        return
    present.update(last_seen_at=now, last_probed_at=now)
    read = [pks[o.key] for o in observed if o.version_ok]
    for start in range(0, len(read), BATCH):
        Worker.objects.filter(pk__in=read[start : start + BATCH]).update(version_probed_at=now)


def store_observation(
    source: Source, observed: list[Observation], run: DiscoveryRun, now: datetime
) -> StoredRefresh:
    """Upsert workers, mark the missing ones gone, and record the diff as events.

    Existing rows are read as plain tuples, not model instances (a steady refresh of 2,000
    workers compares 2,000 rows and writes none of them), and only rows whose refreshed
    columns differ become instances for `bulk_update`.
    """
    existing = {
        worker_key(row[1], row[2], row[3], row[4]): row
        for row in Worker.objects.filter(source=source).values_list(*ROW_COLUMNS)
    }
    by_key = {o.key: o for o in observed}
    previous = {k: _row_snapshot(row) for k, row in existing.items()}
    diff = diff_membership(
        previous,
        {k: _snapshot_against(previous.get(k), o) for k, o in by_key.items()},
    )

    pks: dict[str, int] = {key: row[0] for key, row in existing.items()}
    created: list[str] = []
    new_rows: list[tuple] = []
    updated = _Changes()
    version_at, declared_at = _F["weight_version"], _F["weight_version_declared"]
    lists: dict[tuple[str, ...], list[str]] = {}
    for key, o in by_key.items():
        row = existing.get(key)
        if row is None:
            created.append(key)
            new_rows.append(_new_row(source, o, now, lists))
            continue
        values = _refreshed(o, row[version_at], row[declared_at], lists)
        if values != row[_HEAD:]:
            updated.add(row[0], row[_HEAD:], values)
    departed: list[Worker] = []
    for key in diff.left:
        row = existing[key]
        gone = list(row[_HEAD:])
        gone[_F["state"] - _HEAD] = WorkerState.GONE
        gone[_F["gone_at"] - _HEAD] = now
        # A static worker's identity moves to a new row when its instance id changes (a
        # restart): the gone row lets go of it first (the link is one-to-one).
        gone[_F["static_worker"] - _HEAD] = None
        departed.append(_changed_row(row[0], tuple(gone)))

    if departed:
        Worker.objects.bulk_update(departed, REFRESHED_FIELDS, batch_size=BATCH)
    updated.write()
    if created:
        _insert_new(source, created, new_rows, pks)
    _stamp(source, observed, pks, now)
    # Plain rows: a cold refresh records one event per joining worker, and nothing reads
    # the event instances back.
    insert_values(
        WorkerEvent,
        ("source", "worker", "run", "occurred_at", "kind", "details"),
        (
            (source.pk, pks[c.key], run.pk, now, c.kind, c.details or _NO_DETAILS)
            for c in diff.changes()
        ),
    )
    erroring = sum(1 for o in observed if o.error)
    return StoredRefresh(diff, pks, len(observed), len(observed) - erroring, erroring)
