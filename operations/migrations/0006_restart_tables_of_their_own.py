"""The restarts' tables take their app's names: ``catalog_restartoperation`` and ``catalog_restartstep``
become ``operations_restartoperation`` and ``operations_restartstep`` (Django's defaults, the models no
longer name a table), their rows as they were.

A rename keeps what hangs on a table: its indexes and constraints (under the names they were made with),
the step's foreign key to its operation, the version triggers (versions/triggers.py: on PostgreSQL by
the table's identity; on SQLite their ``ON`` clause is rewritten, and their names, which say the table's,
are made to follow) and, on PostgreSQL, the privileges ``db_app_role`` granted on them. They have no
other trigger: they are not catalog tables, whose row changes the database records (audit/0005).
"""

from django.db import migrations

from versions import triggers


class Migration(migrations.Migration):
    dependencies = [
        ("operations", "0005_agent_contact"),
        # After every version trigger is on the tables, so that they are renamed with them (and, undone,
        # before versions/0001 looks for them under the old names).
        ("versions", "0003_sqlite_triggers_without_a_conflict_clause"),
    ]

    operations = [
        # Undone, last: the version triggers named after the old names, once the tables have them again.
        migrations.RunPython(migrations.RunPython.noop, triggers.name_sqlite_triggers_after_their_tables),
        migrations.AlterModelTable(name="restartoperation", table=None),
        migrations.AlterModelTable(name="restartstep", table=None),
        migrations.RunPython(triggers.name_sqlite_triggers_after_their_tables, migrations.RunPython.noop),
    ]
