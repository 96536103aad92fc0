"""The audit log's entries raise a version of their own (the pages' history panels are kept under it)."""

from django.db import migrations

from versions import triggers

TABLE = "catalog_auditentry"


def uninstall_audit(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {triggers.TRIGGER} ON {TABLE};", params=None)
    elif vendor == "sqlite":
        for op in triggers.SQLITE_OPS:
            schema_editor.execute(
                f"DROP TRIGGER IF EXISTS {triggers.sqlite_trigger_name(TABLE, op)}", params=None
            )
    schema_editor.execute("DELETE FROM versions_version WHERE area = 'audit'", params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("versions", "0001_initial"),
        ("audit", "0005_row_changes"),
    ]

    operations = [migrations.RunPython(triggers.install, uninstall_audit)]
