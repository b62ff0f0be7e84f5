"""Bulk INSERT for the hot paths (discovery's workers and events, the refresh journal): one
prepared statement per batch, run many times.

A discovery refresh where 2,000 workers join inserts 2,000 workers (28 columns) and 2,000
events; a policy refresh of 500 workers journals 3,000 calls. Django's `bulk_create` compiler
spends ~7 µs per value assembling one giant statement (more in DEBUG, where SQLite re-quotes
every parameter for the query log), several times what the database needs. Here each value is
still prepared by its field (`get_db_prep_save`: JSON, time zones, foreign keys), so the stored
rows are identical; the statement is `executemany`. No primary keys come back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from django.db import connections, router
from django.db.models import Field, Model

BATCH = 500
_UNSET = object()


def insert_values(
    model: type[Model], field_names: Sequence[str], rows: Iterable[Sequence], *, batch=BATCH
) -> None:
    """Insert `rows` (Python values in `field_names` order; omitted columns must be nullable
    or have a database default — model defaults are not applied)."""
    db = router.db_for_write(model)
    connection = connections[db]
    opts = model._meta
    fields = [cast(Field, opts.get_field(name)) for name in field_names]  # concrete columns
    qn = connection.ops.quote_name
    sql = "INSERT INTO {} ({}) VALUES ({})".format(
        qn(opts.db_table),
        ", ".join(qn(cast(str, f.column)) for f in fields),
        ", ".join(["%s"] * len(fields)),
    )
    preps = [f.get_db_prep_save for f in fields]
    # Rows of one refresh repeat values column by column (the same `now` in four timestamp
    # columns of every row, the same source, state, family): a value that is the very object
    # the previous row had in that column is prepared once. Preparing is a pure function of
    # the value, so identity is a safe key.
    last: list = [_UNSET] * len(fields)
    last_prepared: list = [None] * len(fields)
    pending: list[list] = []
    with connection.cursor() as cursor:
        for row in rows:
            if len(row) != len(fields):
                raise ValueError(f"row has {len(row)} values for {len(fields)} columns")
            prepared = []
            for i, value in enumerate(row):
                if value is not last[i]:
                    last[i] = value
                    last_prepared[i] = preps[i](value, connection)
                prepared.append(last_prepared[i])
            pending.append(prepared)
            if len(pending) >= batch:
                cursor.executemany(sql, pending)
                pending = []
        if pending:
            cursor.executemany(sql, pending)


def insert_objects(model: type[Model], objs: Sequence[Model], *, batch=BATCH) -> None:
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
