"""The flush after a transactional test, made cheap: it leaves the database as Django's would, in a
fraction of the time (about 1.5 s of every transactional test's teardown on PostgreSQL, more than
the test itself for most of them).

Django empties every table (PostgreSQL: one ``TRUNCATE`` of them all, which makes every table and
index anew on disk, about a second), then emits ``post_migrate``, whose handlers write the content
types, the permissions and the role groups again from the models (about half a second). Here:

- on PostgreSQL the owner ``DELETE``s every table's rows, in one transaction with the triggers
  lifted, as the ``TRUNCATE`` ran (``db_roles.flush_as_the_owner``): milliseconds for tables of a
  few rows;
- the first flush of the session emits ``post_migrate`` as Django does, and every row its handlers
  wrote is kept (the content types, the permissions, the role groups and their permissions; on
  SQLite the version counters too, versions/triggers.py); each later flush puts those tables back
  as they were then, instead of emitting it again: the same rows, with the same ids.

Only the flush is changed: ``migrate`` (tests/test_migrations.py) emits ``post_migrate`` as ever.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management import sql as management_sql
from django.core.management.commands import flush as flush_command
from django.db import connections, transaction

# Per database alias: (table, columns, rows) of each table the first flush of the session left rows in.
_kept: dict[str, list[tuple[str, list[str], list[tuple[Any, ...]]]]] = {}


def _emit_or_restore(verbosity: int, interactive: bool, database: str, **kwargs: Any) -> None:
    """Stands for ``emit_post_migrate_signal`` in the flush command."""
    if database not in _kept:
        _emit(verbosity, interactive, database, **kwargs)
        _kept[database] = _read(database)
        return
    _restore(database)


_emit = management_sql.emit_post_migrate_signal


def _read(database: str) -> list[tuple[str, list[str], list[tuple[Any, ...]]]]:
    connection = connections[database]
    kept = []
    with connection.cursor() as cursor:
        for table in connection.introspection.django_table_names(only_existing=True, include_views=False):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            rows = [tuple(row) for row in cursor.fetchall()]
            if rows:
                kept.append((table, [c[0] for c in cursor.description], rows))
    return kept


def _restore(database: str) -> None:
    from django.contrib.contenttypes.models import ContentType

    connection = connections[database]
    q = connection.ops.quote_name
    with transaction.atomic(using=database), connection.cursor() as cursor:
        for table, columns, rows in _kept[database]:
            if table == "versions_version" and connection.vendor == "postgresql":
                # The counters, which the application's role may not write: the restore's own writes of
                # the role groups raise the one they count under (access) from the emptied table.
                continue
            # Empty already, but on SQLite the flush's own DELETEs may have raised a version counter.
            cursor.execute(f"DELETE FROM {q(table)}")
            cursor.executemany(
                f"INSERT INTO {q(table)} ({', '.join(q(c) for c in columns)}) "
                f"VALUES ({', '.join(['%s'] * len(columns))})",
                rows,
            )
    # As post_migrate's create_contenttypes does: a test that migrated may have cached other ids.
    ContentType.objects.clear_cache()


@contextmanager
def cheap_flushes() -> Iterator[None]:
    """For the block (the test session), flushes restore what post_migrate wrote instead of
    emitting it again."""
    # The command's own name for it (its module imports it by name; the stubs do not say so).
    flush_command.emit_post_migrate_signal = _emit_or_restore  # type: ignore[attr-defined]
    try:
        yield
    finally:
        flush_command.emit_post_migrate_signal = _emit  # type: ignore[attr-defined]
        _kept.clear()
