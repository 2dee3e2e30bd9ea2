"""SQL the ORM does not write well for batches: setting a few fields of many rows in one statement
(`update_rows`: `UPDATE t SET f = v.f FROM (VALUES ...) v WHERE t.pk = v.pk`), inserting many rows without model
instances (`insert_rows`), and a timestamp as seconds since the epoch in an aggregate (`Epoch`).

Django's bulk_update builds a CASE WHEN per row and field, which costs more Python than the database's work at a
thousand rows (metering posts that many leases a tick). Values go through each field's own preparation for the
connection, and PostgreSQL gets explicit casts; SQLite (3.33 and newer) takes the same statement.
"""
from __future__ import annotations

from typing import Iterable

from django.db import connection
from django.db.models import FloatField, Func, Model


class Epoch(Func):
    """A datetime column as seconds since 1970 (a float), on PostgreSQL and SQLite."""

    output_field = FloatField()

    def as_postgresql(self, compiler, conn, **extra):
        return self.as_sql(compiler, conn, template="EXTRACT(EPOCH FROM %(expressions)s)::float8", **extra)

    def as_sqlite(self, compiler, conn, **extra):
        # Django stores datetimes as UTC text; julianday reads it, fractions of a second included.
        return self.as_sql(compiler, conn, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)", **extra)


def _pg_arrays(columns, rows) -> tuple[str, list]:
    """PostgreSQL: one array parameter per column, unnested (a thousand rows are a handful of parameters, not
    thousands of placeholders for the driver to parse)."""
    casts = [f"%s::{c.cast_db_type(connection)}[]" for c in columns]
    arrays = [list(values) for values in zip(*rows)]
    return f"UNNEST({', '.join(casts)})", arrays


def update_rows(model: type[Model], fields: list[str], rows: Iterable[tuple]) -> int:
    """`rows` are (pk, value of fields[0], value of fields[1], ...); returns the number of rows updated."""
    rows = list(rows)
    if not rows:
        return 0
    meta = model._meta
    columns = [meta.pk] + [meta.get_field(f) for f in fields]
    qn = connection.ops.quote_name
    aliases = [qn(f"c{i}") for i in range(len(columns))]
    sets = ", ".join(f"{qn(c.column)} = v.{aliases[i + 1]}" for i, c in enumerate(columns[1:]))
    table = qn(meta.db_table)
    if connection.vendor == "postgresql":
        source, params = _pg_arrays(columns, rows)
        source = f"{source} AS v({', '.join(aliases)})"
    else:
        row_sql = "(" + ", ".join(["%s"] * len(columns)) + ")"
        names = ", ".join(f"column{i + 1} AS {a}" for i, a in enumerate(aliases))
        source = f"(SELECT {names} FROM (VALUES {', '.join([row_sql] * len(rows))}) AS x) AS v"
        params = [col.get_db_prep_save(value, connection) for row in rows for col, value in zip(columns, row)]
    sql = f"UPDATE {table} SET {sets} FROM {source} WHERE {table}.{qn(meta.pk.column)} = v.{aliases[0]}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def insert_rows(model: type[Model], fields: list[str], rows: Iterable[tuple], *, chunk: int = 20000) -> int:
    """INSERT `rows` (values of `fields`, in order). No model instances and no defaults: name every column the
    table needs, auto_now_add ones too. PostgreSQL takes one array per column; elsewhere each value goes
    through its field's preparation, in statements of at most `chunk` parameters."""
    rows = list(rows)
    if not rows:
        return 0
    meta = model._meta
    columns = [meta.get_field(f) for f in fields]
    qn = connection.ops.quote_name
    head = f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(c.column) for c in columns)}) "
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            source, params = _pg_arrays(columns, rows)
            cursor.execute(f"{head}SELECT * FROM {source}", params)
            return len(rows)
        row_sql = "(" + ", ".join(["%s"] * len(columns)) + ")"
        per = max(1, chunk // len(columns))
        for i in range(0, len(rows), per):
            part = rows[i:i + per]
            params = [c.get_db_prep_save(v, connection) for row in part for c, v in zip(columns, row)]
            cursor.execute(head + "VALUES " + ", ".join([row_sql] * len(part)), params)
    return len(rows)
