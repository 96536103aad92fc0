"""The catalog's counter split in three, ``structure``, ``placement`` and ``replicas``, and telemetry's renamed
``readings`` (issue 25): a replica's state change no longer throws away the answers that show only
the fleet's structure. Users, groups and permissions raise ``access``, under which each user's
permissions are kept. Undone, the areas are the apps again."""

from django.db import migrations

from versions import triggers

FORMER_AREAS = {"catalog": "catalog", "operations": "operations", "telemetry": "telemetry", "audit": "audit"}
FORMER_ORDER = ("catalog", "operations", "telemetry", "audit")


def split(apps, schema_editor):
    triggers.install(apps, schema_editor)
    schema_editor.execute("DELETE FROM versions_version WHERE area IN ('catalog', 'telemetry')", params=None)


def join(apps, schema_editor):
    triggers.install_areas(apps, schema_editor, FORMER_AREAS, {}, FORMER_ORDER)
    schema_editor.execute(
        "DELETE FROM versions_version WHERE area IN ('structure', 'placement', 'replicas', 'readings', 'access')",
        params=None,
    )
    for table in (
        "auth_user",
        "auth_group",
        "auth_permission",
        "auth_user_groups",
        "auth_group_permissions",
        "auth_user_user_permissions",
    ):
        drop_trigger(schema_editor, table)


def drop_trigger(schema_editor, table):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {triggers.TRIGGER} ON {table};", params=None)
    else:
        for op in triggers.SQLITE_OPS:
            schema_editor.execute(
                f"DROP TRIGGER IF EXISTS {triggers.sqlite_trigger_name(table, op)}", params=None
            )


class Migration(migrations.Migration):
    dependencies = [
        ("versions", "0003_sqlite_triggers_without_a_conflict_clause"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(split, join)]
