"""The catalog's counter split in two, ``structure`` and ``replicas``, and telemetry's renamed
``readings`` (issue 25): a replica's state change no longer throws away the answers that show only
the fleet's structure. Undone, the areas are the apps again."""

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
        "DELETE FROM versions_version WHERE area IN ('structure', 'replicas', 'readings')", params=None
    )


class Migration(migrations.Migration):
    dependencies = [("versions", "0003_sqlite_triggers_without_a_conflict_clause")]

    operations = [migrations.RunPython(split, join)]
