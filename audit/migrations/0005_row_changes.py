"""On PostgreSQL, every row change of a catalog table is recorded by the database itself, with its transaction.

A trigger on each catalog table writes the row before and after, the
transaction id and the role that connected into ``audit_rowchange``
(append-only, as the log is; the function runs as its owner, so the
application's role needs no right on that table). A trigger on the audit log
stamps each entry with its transaction id. A row change whose transaction
wrote no audit entry was made outside the application (audit.selectors.
changed_outside). An UPDATE that changes nothing is not recorded. SQLite has
no such triggers: there nothing is recorded (check --deploy says so).

The catalog's tables are those of the catalog app as of this migration; a new
catalog table needs its trigger added in its own migration (a test checks
every catalog table has one).
"""

from django.conf import settings
from django.db import migrations, models


FUNCTIONS = """
CREATE FUNCTION audit_entry_txid() RETURNS trigger AS $$
BEGIN
    NEW.txid := txid_current();
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER catalog_audit_txid BEFORE INSERT ON catalog_auditentry
    FOR EACH ROW EXECUTE FUNCTION audit_entry_txid();

CREATE FUNCTION audit_row_change() RETURNS trigger SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    old_row jsonb := CASE WHEN TG_OP IN ('UPDATE', 'DELETE') THEN to_jsonb(OLD) END;
    new_row jsonb := CASE WHEN TG_OP IN ('INSERT', 'UPDATE') THEN to_jsonb(NEW) END;
BEGIN
    IF TG_OP = 'UPDATE' AND old_row = new_row THEN
        RETURN NULL;
    END IF;
    INSERT INTO audit_rowchange (at, txid, table_name, operation, row_key, before, after, db_role)
    VALUES (now(), txid_current(), TG_TABLE_NAME, TG_OP,
            COALESCE(COALESCE(new_row, old_row) ->> 'id', ''), old_row, new_row, session_user);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE FUNCTION audit_table_truncated() RETURNS trigger SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO audit_rowchange (at, txid, table_name, operation, row_key, before, after, db_role)
    VALUES (now(), txid_current(), TG_TABLE_NAME, TG_OP, '', NULL, NULL, session_user);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER audit_rowchange_no_update BEFORE UPDATE OR DELETE ON audit_rowchange
    FOR EACH ROW EXECUTE FUNCTION catalog_audit_append_only();
CREATE TRIGGER audit_rowchange_no_truncate BEFORE TRUNCATE ON audit_rowchange
    FOR EACH STATEMENT EXECUTE FUNCTION catalog_audit_append_only();
"""
DROP_FUNCTIONS = """
DROP TRIGGER IF EXISTS audit_rowchange_no_truncate ON audit_rowchange;
DROP TRIGGER IF EXISTS audit_rowchange_no_update ON audit_rowchange;
DROP TRIGGER IF EXISTS catalog_audit_txid ON catalog_auditentry;
DROP FUNCTION IF EXISTS audit_table_truncated();
DROP FUNCTION IF EXISTS audit_row_change();
DROP FUNCTION IF EXISTS audit_entry_txid();
"""


def catalog_tables(apps):
    return sorted(m._meta.db_table for m in apps.get_app_config("catalog").get_models())


def up(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTIONS, params=None)
    for table in catalog_tables(apps):
        schema_editor.execute(
            f"CREATE TRIGGER audit_row_change AFTER INSERT OR UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION audit_row_change();"
            f"CREATE TRIGGER audit_table_truncated AFTER TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_table_truncated();",
            params=None,
        )


def down(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in catalog_tables(apps):
        schema_editor.execute(
            f"DROP TRIGGER IF EXISTS audit_row_change ON {table};"
            f"DROP TRIGGER IF EXISTS audit_table_truncated ON {table};",
            params=None,
        )
    schema_editor.execute(DROP_FUNCTIONS, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0004_audit_refuses_truncate"),
        ("catalog", "0007_model_expert_storage"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="RowChange",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("at", models.DateTimeField()),
                ("txid", models.BigIntegerField()),
                ("table_name", models.CharField(max_length=64)),
                ("operation", models.CharField(max_length=8)),
                ("row_key", models.CharField(blank=True, default="", max_length=64)),
                ("before", models.JSONField(blank=True, null=True)),
                ("after", models.JSONField(blank=True, null=True)),
                (
                    "db_role",
                    models.CharField(
                        help_text="The database role that connected (session_user).", max_length=64
                    ),
                ),
            ],
            options={
                "ordering": ["-id"],
            },
        ),
        migrations.AddField(
            model_name="auditentry",
            name="txid",
            field=models.BigIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddIndex(
            model_name="auditentry",
            index=models.Index(fields=["txid"], name="audit_txid"),
        ),
        migrations.AddIndex(
            model_name="rowchange",
            index=models.Index(fields=["txid"], name="audit_rowchange_txid"),
        ),
        migrations.RunPython(up, down),
    ]
