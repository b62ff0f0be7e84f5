"""Bulk INSERT for the hot paths (discovery's workers and events, the refresh journal).

A discovery run where 2,000 workers join inserts 2,000 workers (28 columns) and 2,000
events; a policy refresh of 500 workers journals 3,000 calls. Django's `bulk_create` compiler
spends ~7 µs per value assembling one giant statement, and even a prepared `executemany` sends
one statement per row (psycopg pipelines them, but each is still parsed, bound and executed by
the server, ~1 ms a row at 500 workers on a busy machine). So:

- on PostgreSQL the rows go in with one `COPY ... FROM STDIN` per call (psycopg 3's
  `cursor.copy`, rows formatted by psycopg's C adapter): one statement whatever the row count;
- elsewhere (SQLite, the embedded demo) the portable path: one prepared statement run with
  `executemany` per `batch` rows.

Both run inside the caller's transaction: a COPY is one statement like any other, so a failing
fence (`Lease.guard`) or error rolls the rows back with everything else. Each value is still
prepared by its field (`get_db_prep_save`: JSON, time zones, foreign keys), so the stored rows
are identical either way. No primary keys come back (on PostgreSQL a caller that needs them
reserves them first with `reserve_ids` and inserts them as a column). A JSON value the
caller has already serialised is passed as `JsonText` and stored as is (the journal
serialises each distinct body once per run, not once per row). A COPY counts as one query
for Django's query capture and execute wrappers, so query-count tests and instrumentation
see it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, cast

from django.db import connections, router
from django.db.models import (
    AutoField,
    BigAutoField,
    BigIntegerField,
    BooleanField,
    CharField,
    DateTimeField,
    Field,
    FloatField,
    ForeignKey,
    IntegerField,
    JSONField,
    Model,
    PositiveBigIntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
    SmallAutoField,
    SmallIntegerField,
    TextField,
)

BATCH = 500
_UNSET = object()


class JsonText(str):
    """A JSON document already serialised (compact UTF-8 text, no NaN): stored verbatim in a
    JSON column instead of being encoded again."""

    __slots__ = ()


#: Column types whose database value of a str is the str itself (exact types: a subclass
#: may prepare differently).
_PLAIN_TEXT = (CharField, TextField)
#: Distinct JSON values per column whose text a COPY remembers (by identity) within one call.
JSON_MEMO = 256


#: Exact field classes whose database value is the Python value itself when that value has
#: one of these exact types: `get_db_prep_save` would only hand it back (`int(5)`, `str("x")`)
#: after a few calls each. A journal flush prepares ~8 distinct values per row of thousands.
#: Subclasses and other types take Django's own path.
_NATIVE: dict[type[Field], tuple[type, ...]] = {
    CharField: (str,),
    TextField: (str,),
    BooleanField: (bool,),
    FloatField: (float,),
    IntegerField: (int,),
    SmallIntegerField: (int,),
    BigIntegerField: (int,),
    PositiveIntegerField: (int,),
    PositiveSmallIntegerField: (int,),
    PositiveBigIntegerField: (int,),
    AutoField: (int,),
    BigAutoField: (int,),
    SmallAutoField: (int,),
}


def _native_types(field: Field, connection, *, copy: bool) -> tuple[type, ...]:
    if type(field) is ForeignKey:
        target = field.target_field
        return (int,) if isinstance(target, IntegerField) else ()
    if type(field) is DateTimeField and copy:
        # PostgreSQL takes an aware datetime as is (`adapt_datetimefield_value` returns it);
        # a naive one goes through Django for its warning and conversion.
        return (datetime,)
    return _NATIVE.get(type(field), ())


def _preparer(field: Field, connection, *, copy: bool) -> Callable[[Any], Any]:
    prep = field.get_db_prep_save
    if type(field) in _PLAIN_TEXT:
        # A str is its own database value in a plain text column (their get_prep_value is
        # to_python, which returns a str unchanged); anything else takes the field's path.
        return lambda value: value if type(value) is str else prep(value, connection)
    if not isinstance(field, JSONField):
        native = _native_types(field, connection, copy=copy)
        if not native:
            return lambda value: prep(value, connection)
        aware_only = datetime in native

        def prepare(value: Any) -> Any:
            if value is None:
                return prep(value, connection)
            if type(value) in native and not (aware_only and value.tzinfo is None):
                return value
            return prep(value, connection)

        return prepare
    if not copy:

        def prepare_json(value: Any) -> Any:
            # The JSON column's text form is the serialised document (the stored text on
            # SQLite), so it needs no encoding of ours.
            return str(value) if isinstance(value, JsonText) else prep(value, connection)

        return prepare_json

    # COPY sends every value as text, and jsonb's text input is the JSON document: exactly
    # what psycopg's Jsonb dumper would have produced with the field's encoder. Shared values
    # (one reply decoded once for a whole fleet, one request body per call template) are
    # serialised once: remembered by identity, with the value held so its id stays its own.
    memo: dict[int, tuple[Any, str]] = {}
    # One encoder for the column: `json.dumps(value, cls=...)` builds a new one per value,
    # and `encode` of the same settings gives the same text.
    encode = (field.encoder or json.JSONEncoder)().encode

    def copy_json(value: Any) -> Any:
        if value is None or isinstance(value, JsonText):
            return value if value is None else str(value)
        if not isinstance(value, dict | list | str | int | float | bool):
            return prep(value, connection)  # an expression or the like: Django's own path
        known = memo.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        text = encode(value)
        if len(memo) >= JSON_MEMO:
            memo.clear()
        memo[id(value)] = (value, text)
        return text

    return copy_json


def _as_is(field: Field, connection, *, copy: bool) -> frozenset[type]:
    """Exact value types this column stores as they are (the preparer would hand each back
    unchanged): a column holding only those needs no per-value call. Aware-only datetimes
    are left out, since telling them apart takes a look at each value anyway."""
    if type(field) in _PLAIN_TEXT:
        return frozenset((str,))
    if isinstance(field, JSONField):
        return frozenset()
    return frozenset(t for t in _native_types(field, connection, copy=copy) if t is not datetime)


def _prepared_column(prepare: Callable[[Any], Any], values: Sequence) -> list:
    """One column as database values. A value that is the very object the previous row had
    in this column is prepared once (the same `now` in every row, the same source, state,
    request body); preparing is a pure function of the value, so identity is a safe key."""
    out = []
    last: Any = _UNSET
    last_prepared = None
    for value in values:
        if value is not last:
            last = value
            last_prepared = prepare(value)
        out.append(last_prepared)
    return out


def _prepared_rows(
    fields: list[Field], connection, rows: Iterable[Sequence], *, copy: bool
) -> list[tuple]:
    """Rows as database values, prepared column by column: a column whose values all have a
    type the column stores as is (`_as_is`: the str columns, the integer keys) is taken whole
    after one look at its types, the rest value by value (`_prepared_column`). A cold
    discovery run inserts 2,000 rows of 28 columns, most of them plain text."""
    rows = rows if isinstance(rows, list) else list(rows)
    width = len(fields)
    for row in rows:
        if len(row) != width:
            raise ValueError(f"row has {len(row)} values for {width} columns")
    if not rows:
        return []
    columns: list[Sequence] = list(zip(*rows, strict=True))
    for i, field in enumerate(fields):
        values = columns[i]
        as_is = _as_is(field, connection, copy=copy)
        if not as_is or not set(map(type, values)) <= as_is:
            columns[i] = _prepared_column(_preparer(field, connection, copy=copy), values)
    return list(zip(*columns, strict=True))


def _copy(cursor, sql: str, rows: Iterable[Sequence]) -> None:
    """One COPY through Django's cursor wrapper, so execute wrappers and the debug query log
    record it as one statement."""

    def run(sql, params, many, context):
        with cursor.db.wrap_database_errors, cursor.cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)

    debug_sql = getattr(cursor, "debug_sql", None)  # only on the DEBUG / query-capture wrapper
    if debug_sql is None:
        cursor._execute_with_wrappers(sql, None, many=False, executor=run)
        return
    with debug_sql(sql, None):
        cursor._execute_with_wrappers(sql, None, many=False, executor=run)


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
    table = qn(opts.db_table)
    columns = ", ".join(qn(cast(str, f.column)) for f in fields)
    copy = connection.vendor == "postgresql"
    prepared = _prepared_rows(fields, connection, rows, copy=copy)
    with connection.cursor() as cursor:
        if copy:
            # Nothing to send is no statement at all (a COPY of zero rows is still a round trip).
            if prepared:
                _copy(cursor, f"COPY {table} ({columns}) FROM STDIN", prepared)
            return
        sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})"
        pending: list[tuple] = []
        for row in prepared:
            pending.append(row)
            if len(pending) >= batch:
                cursor.executemany(sql, pending)
                pending = []
        if pending:
            cursor.executemany(sql, pending)


def reserve_ids(model: type[Model], count: int) -> list[int] | None:
    """`count` primary keys taken from the table's own sequence, for rows the caller will
    insert with their ids given (so it knows each row's id without reading the rows back).
    None where the database has no sequence to draw from (SQLite): insert without ids there.

    `nextval` hands every caller distinct values, whatever transaction it runs in, so ids
    reserved here never collide with another insert's; an id whose insert rolls back is
    skipped, as with any sequence."""
    db = router.db_for_write(model)
    connection = connections[db]
    if connection.vendor != "postgresql":
        return None
    if count <= 0:
        return []
    opts = model._meta
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [connection.ops.quote_name(opts.db_table), opts.pk.column, count],
        )
        return [row[0] for row in cursor.fetchall()]


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
