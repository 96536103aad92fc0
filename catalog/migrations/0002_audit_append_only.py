"""On PostgreSQL, the database itself refuses to change or remove an audit entry.

The ORM already refuses; this stops raw SQL and other clients too. SQLite gets
the equivalent triggers.
"""

from django.db import migrations

PG_UP = """
CREATE OR REPLACE FUNCTION catalog_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit entries are append-only: % refused', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER catalog_audit_no_update BEFORE UPDATE OR DELETE ON catalog_auditentry
    FOR EACH ROW EXECUTE FUNCTION catalog_audit_append_only();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS catalog_audit_no_update ON catalog_auditentry;
DROP FUNCTION IF EXISTS catalog_audit_append_only();
"""
SQLITE_UP = [
    """CREATE TRIGGER catalog_audit_no_update BEFORE UPDATE ON catalog_auditentry
       BEGIN SELECT RAISE(ABORT, 'audit entries are append-only: UPDATE refused'); END;""",
    """CREATE TRIGGER catalog_audit_no_delete BEFORE DELETE ON catalog_auditentry
       BEGIN SELECT RAISE(ABORT, 'audit entries are append-only: DELETE refused'); END;""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS catalog_audit_no_update;",
    "DROP TRIGGER IF EXISTS catalog_audit_no_delete;",
]


def up(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_UP, params=None)
    elif vendor == "sqlite":
        for sql in SQLITE_UP:
            schema_editor.execute(sql)


def down(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_DOWN, params=None)
    elif vendor == "sqlite":
        for sql in SQLITE_DOWN:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [("catalog", "0001_initial")]
    operations = [migrations.RunPython(up, down)]
