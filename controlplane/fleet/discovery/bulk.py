"""Bulk INSERT for the refresh hot paths: one prepared statement per batch, run many times.

A discovery refresh where 2,000 workers join inserts 2,000 workers (28 columns) and 2,000
events; a policy refresh of 500 workers journals 3,000 calls. Django's `bulk_create` compiler
spends ~7 µs per value assembling one giant statement (more in DEBUG, where SQLite re-quotes
every parameter for the query log), several times what the database needs. Here each value is
still prepared by its field (`get_db_prep_save`: JSON, time zones, foreign keys), so the stored
rows are identical; the statement is `executemany`. No primary keys come back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import connections, router
from django.db.models import Model

BATCH = 500


def insert_values(
    model: type[Model], field_names: Sequence[str], rows: Iterable[Sequence], *, batch=BATCH
) -> None:
    """Insert `rows` (Python values in `field_names` order; omitted columns must be nullable
    or have a database default — model defaults are not applied)."""
    db = router.db_for_write(model)
    connection = connections[db]
    opts = model._meta
    fields = [opts.get_field(name) for name in field_names]
    qn = connection.ops.quote_name
    sql = "INSERT INTO {} ({}) VALUES ({})".format(
        qn(opts.db_table),
        ", ".join(qn(f.column) for f in fields),
        ", ".join(["%s"] * len(fields)),
    )
    preps = [f.get_db_prep_save for f in fields]
    pending: list[list] = []
    with connection.cursor() as cursor:
        for row in rows:
            values = zip(preps, row, strict=True)
            pending.append([prep(value, connection) for prep, value in values])
            if len(pending) >= batch:
                cursor.executemany(sql, pending)
                pending = []
        if pending:
            cursor.executemany(sql, pending)


def insert_objects(model: type[Model], objs: list[Model], *, batch=BATCH) -> None:
    """`bulk_create(objs)` without primary keys coming back (model defaults already applied
    by the constructor; `pre_save` runs, so auto_now and the like behave as in `save`)."""
    if not objs:
        return
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    insert_values(
        model,
        [f.name for f in fields],
        ([f.pre_save(obj, True) for f in fields] for obj in objs),
        batch=batch,
    )
    db = router.db_for_write(model)
    for obj in objs:
        obj._state.adding = False
        obj._state.db = db
