"""The audit log's table takes its app's name: ``catalog_auditentry`` becomes ``audit_auditentry``
(Django's default, ``AuditEntry`` no longer names a table), its rows, ids and hashes as they were.

A rename keeps what hangs on the table on both databases: its indexes and constraints (under the names
they were made with), its triggers (PostgreSQL by the table's identity; SQLite rewrites their ``ON``
clause) and, on PostgreSQL, the privileges ``db_app_role`` granted and revoked on it. What said the old
name is made again under names of the audit log's own:

- the append-only guards (catalog/0002, audit/0004): ``audit_entry_no_update`` (UPDATE and DELETE;
  on SQLite UPDATE only, and ``audit_entry_no_delete``) and, on PostgreSQL, ``audit_entry_no_truncate``;
  their function ``catalog_audit_append_only`` is renamed ``audit_append_only``, which the row
  changes' own guards (audit/0005) follow, being bound to the function and not its name;
- the transaction id's trigger (audit/0005), ``audit_entry_txid``;
- on SQLite, the version triggers (versions/triggers.py), named after their table.

Undone, each goes back to its old name in the reverse order. The table's name is read from the
migration's state, never written out: the guards are put on whatever the model's table is, and are
there after it whether or not they all were before.
"""

from django.db import migrations

from versions import triggers

OLD, NEW = "catalog_audit", "audit_entry"  # the guards' names before and after
OLD_FUNCTION, NEW_FUNCTION = "catalog_audit_append_only", "audit_append_only"


def pg_guards(table: str, prefix: str, function: str) -> str:
    return f"""
CREATE TRIGGER {prefix}_no_update BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
CREATE TRIGGER {prefix}_no_truncate BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {function}();
CREATE TRIGGER {prefix}_txid BEFORE INSERT ON {table}
    FOR EACH ROW EXECUTE FUNCTION audit_entry_txid();
"""


def pg_drop_guards(table: str, prefix: str) -> str:
    return "".join(
        f"DROP TRIGGER IF EXISTS {prefix}_{what} ON {table};" for what in ("no_update", "no_truncate", "txid")
    )


def sqlite_guards(table: str, prefix: str = NEW) -> list[str]:
    """The SQLite guards on ``table`` (the tests lift and put back these to empty the log)."""
    return [
        f"""CREATE TRIGGER {prefix}_no_{op.lower()} BEFORE {op} ON {table}
       BEGIN SELECT RAISE(ABORT, 'audit entries are append-only: {op} refused'); END;"""
        for op in ("UPDATE", "DELETE")
    ]


def sqlite_drop_guards(prefix: str = NEW) -> list[str]:
    return [f"DROP TRIGGER IF EXISTS {prefix}_no_{what}" for what in ("update", "delete")]


def rename_guards(apps, schema_editor, *, old: str, new: str, old_function: str, new_function: str) -> None:
    table = apps.get_model("audit", "AuditEntry")._meta.db_table
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(pg_drop_guards(table, old), params=None)
        schema_editor.execute(f"ALTER FUNCTION {old_function}() RENAME TO {new_function};", params=None)
        schema_editor.execute(pg_guards(table, new, new_function), params=None)
    elif vendor == "sqlite":
        for sql in sqlite_drop_guards(old) + sqlite_guards(table, new):
            schema_editor.execute(sql, params=None)


def forwards(apps, schema_editor):
    rename_guards(apps, schema_editor, old=OLD, new=NEW, old_function=OLD_FUNCTION, new_function=NEW_FUNCTION)


def backwards(apps, schema_editor):
    rename_guards(apps, schema_editor, old=NEW, new=OLD, old_function=NEW_FUNCTION, new_function=OLD_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0005_row_changes"),
        # After every version trigger is on the table, so that they are renamed with it (and, undone,
        # before versions/0002 looks for the log's under the old name).
        ("versions", "0003_sqlite_triggers_without_a_conflict_clause"),
    ]

    operations = [
        # Undone, last: the version triggers named after the old name, once the table has it again.
        migrations.RunPython(migrations.RunPython.noop, triggers.name_sqlite_triggers_after_their_tables),
        migrations.AlterModelTable(name="auditentry", table=None),
        migrations.RunPython(forwards, backwards),
        migrations.RunPython(triggers.name_sqlite_triggers_after_their_tables, migrations.RunPython.noop),
    ]
