"""On PostgreSQL, ``TRUNCATE`` of the audit log is refused too, by a statement trigger.

Row triggers (catalog/0002) never see a ``TRUNCATE``: it removes every row
without visiting one. SQLite has no ``TRUNCATE`` (its ``DELETE`` without a
``WHERE`` fires the row trigger), so there is nothing to add there. The
function is catalog/0002's, which names the refused operation.
"""

from django.db import migrations

PG_UP = """
CREATE TRIGGER catalog_audit_no_truncate BEFORE TRUNCATE ON catalog_auditentry
    FOR EACH STATEMENT EXECUTE FUNCTION catalog_audit_append_only();
"""
PG_DOWN = "DROP TRIGGER IF EXISTS catalog_audit_no_truncate ON catalog_auditentry;"


def up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_UP, params=None)


def down(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DOWN, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_audit_list_indexes")]
    operations = [migrations.RunPython(up, down)]
