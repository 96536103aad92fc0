"""PostgreSQL's two roles: the owner migrates, the application connects as a role that owns nothing.

A table's owner (or a superuser) can ``ALTER TABLE ... DISABLE TRIGGER`` and
then rewrite anything; a role that owns nothing cannot, and without the
UPDATE, DELETE and TRUNCATE privileges on the append-only tables it is refused
even before the triggers speak.
"""

from __future__ import annotations

from django.db import connection

from audit.models import AuditEntry, OutsideChange, RowChange
from versions.models import Version


def append_only_tables() -> tuple[str, str, str]:
    """The tables the application may only read and append to: the audit log, the catalog's row
    history and which of its changes were made outside the application (the last two written by the
    database's triggers alone). Their models' tables, read when asked (never written out: they were
    renamed once)."""
    return AuditEntry._meta.db_table, RowChange._meta.db_table, OutsideChange._meta.db_table


def version_tables() -> tuple[str, str]:
    """The tables only the version triggers write (their functions run as the owner); the pending list has
    no model (versions/triggers.py)."""
    return Version._meta.db_table, "versions_pending"


def grant_app_role(role: str) -> None:
    """Grant ``role`` the application's privileges on the current schema; refuses a role that owns the
    audit table, or is a superuser, since for it append-only would not hold."""
    q = connection.ops.quote_name
    log, row_changes, outside = append_only_tables()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.rolsuper, pg_has_role(r.rolname, t.tableowner, 'MEMBER'), current_schema() "
            "FROM pg_roles r, pg_tables t WHERE r.rolname = %s AND t.tablename = %s "
            "AND t.schemaname = current_schema()",
            [role, log],
        )
        row = cursor.fetchone()
        if row is None:
            raise ValueError(
                f"no role {role!r}, or the database is not migrated: CREATE ROLE {role} LOGIN PASSWORD '...' "
                "first, and migrate as the owner"
            )
        superuser, owns, schema = row
        if superuser or owns:
            raise ValueError(
                f"{role} is {'a superuser' if superuser else 'the owner of the audit table, or a member of it'}: "
                "it could disable the triggers. The application needs a role of its own that owns nothing."
            )
        r, s = q(role), q(schema)
        statements = [
            f"GRANT USAGE ON SCHEMA {s} TO {r}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}",
            f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {r}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {r}",
        ]
        # A table a later migration makes is not there on a database migrated to before it.
        present = set(connection.introspection.table_names(cursor))
        for table in (log, row_changes, outside):
            if table in present:
                statements.append(
                    f"REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON {q(table)} FROM {r}"
                )
        # Only the database's triggers write the row changes and which were made outside (their functions
        # run as the owner).
        for table in (row_changes, outside):
            if table in present:
                statements.append(f"REVOKE INSERT ON {q(table)} FROM {r}")
        # Nor the fleet's versions (versions/triggers.py): a counter set back would give old answers.
        for table in version_tables():
            statements.append(f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON {q(table)} FROM {r}")
        for sql in statements:
            cursor.execute(sql)
