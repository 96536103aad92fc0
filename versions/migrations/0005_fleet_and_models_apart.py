"""The catalog's ``structure`` split in two, ``fleet`` (GPU classes, nodes, cards) and ``models`` (models,
profiles, the engines' default releases) (issue 25): a model's edit no longer throws away the answers
that show only the hardware (the dry runs' rooms, the nodes pages' summary and readings), nor a
node's edit those that show only the models. ``structure`` stays a name for both
(``versions.triggers.ALIASES``). Undone, the catalog raises ``structure`` again."""

from django.db import migrations

from versions import triggers

FORMER_ORDER = ("structure", "placement", "replicas", "operations", "readings", "audit", "access")
FORMER_BY_MODEL = {("catalog", "replica"): "replicas", ("catalog", "shard"): "placement"}


def split(apps, schema_editor):
    triggers.install(apps, schema_editor)
    schema_editor.execute("DELETE FROM versions_version WHERE area = 'structure'", params=None)


def join(apps, schema_editor):
    areas = {**triggers.AREAS, "catalog": "structure"}
    triggers.install_areas(apps, schema_editor, areas, FORMER_BY_MODEL, FORMER_ORDER)
    schema_editor.execute("DELETE FROM versions_version WHERE area IN ('fleet', 'models')", params=None)


class Migration(migrations.Migration):
    # After every tracked table exists, as each app's latest migration leaves it.
    dependencies = [
        ("versions", "0004_areas_structure_replicas_readings"),
        ("catalog", "0015_model_experts_per_token"),
        ("operations", "0008_restart_step_ranks"),
        ("telemetry", "0003_card_sample_by_age"),
        ("audit", "0007_changes_outside_recorded_at_commit"),
    ]

    operations = [migrations.RunPython(split, join)]
