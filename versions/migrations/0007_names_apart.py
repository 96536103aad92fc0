"""A model's name, a profile's name and model, and their rows made or deleted raise a version of their own,
``names`` (besides the models'; ``versions.triggers.NAMED``), so that the answers that name models and show
nothing else of them (the operations, the compact grid, the nodes' summary) are kept through a model's
other edits (issue 25: a model's source edited threw them away)."""

from django.db import migrations

from versions import triggers


def unnamed(apps, schema_editor):
    triggers.uninstall_names(apps, schema_editor)
    schema_editor.execute("DELETE FROM versions_version WHERE area = 'names'", params=None)


class Migration(migrations.Migration):
    dependencies = [("versions", "0006_holders_raise_placement")]

    operations = [migrations.RunPython(triggers.install, unnamed)]
