"""On PostgreSQL, the database records which row changes were made outside the application as each
transaction commits, so that listing them never compares every row change with the whole log.

``changed_outside()`` was ``row changes whose txid is NOT IN (every txid of the log)``: on a million
entries, a subquery scanned again for every row change (minutes), and as ``NOT EXISTS`` still an anti-join
of every row change (one per catalog write: as many as the entries) against the log's txid index, a second
and more for the newest page of ``/audit/outside/``. Now a constraint trigger on ``audit_rowchange``,
deferred to the commit, looks up the committing transaction's audit entries once per row change (one
probe of ``audit_txid``; at the commit, so the entry written after the change counts) and, when there is
none, appends the row change's id to ``audit_outsidechange``. Listing them reads those few rows.

The probe is always a scan of that index, never of the table (the function turns the planner's other
choices off): where the log holds few distinct transaction ids (bulk-loaded entries, ten thousand to a
transaction) the planner would otherwise scan the table for each row change, to the end for a change
that has no entry. Once per row change, not once per transaction: a verdict kept in a transaction-local
setting would be one the transaction itself could set beforehand.

Its function runs as its owner (``SECURITY DEFINER``), so the application's role needs no right on the
table (``db_app_role`` grants it only SELECT); the table is append-only like the log (the log's guard
function, ``audit_append_only``). A change a superuser makes with the triggers off is not recorded, as
before. The row changes recorded before this migration are sorted once, here, the way the selector did.
SQLite records no row changes: the table stays empty there.
"""

import django.db.models.deletion
from django.db import migrations, models


def tables(apps) -> tuple[str, str, str]:
    return tuple(
        apps.get_model("audit", name)._meta.db_table for name in ("AuditEntry", "RowChange", "OutsideChange")
    )


def up(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    log, changes, outside = tables(apps)
    schema_editor.execute(
        f"""
CREATE FUNCTION audit_change_explained() RETURNS trigger SECURITY DEFINER SET search_path FROM CURRENT
    SET enable_seqscan = off SET enable_bitmapscan = off AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {log} WHERE txid = NEW.txid) THEN
        INSERT INTO {outside} (change_id) VALUES (NEW.id);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE CONSTRAINT TRIGGER audit_change_explained AFTER INSERT ON {changes}
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_change_explained();
CREATE TRIGGER audit_outside_no_update BEFORE UPDATE OR DELETE ON {outside}
    FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_outside_no_truncate BEFORE TRUNCATE ON {outside}
    FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();
INSERT INTO {outside} (change_id)
    SELECT c.id FROM {changes} c WHERE NOT EXISTS (SELECT 1 FROM {log} e WHERE e.txid = c.txid);
""",
        params=None,
    )


def down(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    log, changes, outside = tables(apps)
    schema_editor.execute(
        f"""
DROP TRIGGER IF EXISTS audit_outside_no_truncate ON {outside};
DROP TRIGGER IF EXISTS audit_outside_no_update ON {outside};
DROP TRIGGER IF EXISTS audit_change_explained ON {changes};
DROP FUNCTION IF EXISTS audit_change_explained();
""",
        params=None,
    )


class Migration(migrations.Migration):
    dependencies = [("audit", "0006_auditentry_table_of_its_own")]

    operations = [
        migrations.CreateModel(
            name="OutsideChange",
            fields=[
                (
                    "change",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="outside",
                        serialize=False,
                        to="audit.rowchange",
                    ),
                ),
            ],
            options={"ordering": ["-change"]},
        ),
        # Undone, first: the triggers off before the table goes.
        migrations.RunPython(up, down),
    ]
