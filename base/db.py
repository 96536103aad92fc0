"""What every app needs from the database beyond the ORM."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection, models


def hold_lock(key: int) -> None:
    """Hold the lock named by ``key`` until the current transaction ends.

    One transaction at a time holds a key, across every connection and host:
    on PostgreSQL a transaction-level advisory lock; on SQLite, whose write
    transactions already run one at a time (IMMEDIATE), nothing more is needed.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("hold_lock needs a transaction: the lock is released when it ends")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def update_rows(model: type[models.Model], objs: Iterable[models.Model], fields: Iterable[str]) -> None:
    """Write ``fields`` of each of ``objs`` (rows of ``model``, by primary key) as they hold them,
    in one statement: ``bulk_update``'s promise, at a fraction of its cost in the caller's CPU.

    ``bulk_update`` builds a ``CASE WHEN pk = … THEN …`` for every field of every row, each a
    filter the ORM resolves; a restart's worker writing a wave's steps and replicas spent a
    quarter of its CPU there, while the next wave waited for it (docs/benchmarks.md). On
    PostgreSQL the rows go as one ``UPDATE … FROM (VALUES …)``, each value prepared by its field
    as a save would (JSON, times, keys); elsewhere (SQLite, whose restarts run one step at a
    time) ``bulk_update`` itself. Text is assigned, not cast, so a value longer than its column
    is refused as a save refuses it, not cut."""
    objs, names = list(objs), list(fields)
    if not objs or not names:
        return
    if connection.vendor != "postgresql":
        model._default_manager.bulk_update(objs, names)
        return
    meta = model._meta
    pk, columns = meta.pk, [_column(model, name) for name in names]
    assert pk is not None and pk.column is not None  # every concrete model has one
    qn = connection.ops.quote_name
    typed = [_value_type(pk), *(_value_type(f) for f in columns)]
    first = "(" + ", ".join(f"%s::{t}" for t in typed) + ")"
    rest = "(" + ", ".join(["%s"] * len(typed)) + ")"
    params: list[Any] = []
    for obj in objs:
        params.append(pk.get_db_prep_value(obj.pk, connection))
        params.extend(f.get_db_prep_save(getattr(obj, f.attname), connection) for f in columns)
    aliases = ["pk", *(f"c{i}" for i in range(len(columns)))]
    sql = (
        f"UPDATE {qn(meta.db_table)} AS t SET "
        + ", ".join(f"{qn(str(f.column))} = v.c{i}" for i, f in enumerate(columns))
        + f" FROM (VALUES {', '.join([first] + [rest] * (len(objs) - 1))}) AS v({', '.join(aliases)})"
        + f" WHERE t.{qn(pk.column)} = v.pk"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _column(model: type[models.Model], name: str) -> models.Field:
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.concrete or field.column is None:
        raise TypeError(f"{model.__name__}.{name} is not a column: update_rows writes columns only")
    return field


def _value_type(field: models.Field) -> str:
    """The type a column's values are given in ``update_rows``'s VALUES: the column's own, but text
    for text columns (assigned to ``varchar(n)``, an over-long value is an error, cast it is cut)."""
    if isinstance(field, models.CharField | models.TextField):
        return "text"
    db_type = field.db_type(connection)  # a key's: the type of what it points to
    if db_type is None:
        raise TypeError(f"{field} has no column type to write")
    return db_type
