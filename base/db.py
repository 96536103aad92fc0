"""What every app needs from the database beyond the ORM."""

from __future__ import annotations

from django.db import connection


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
