"""The fleet's versions and the triggers that raise them (versions/triggers.py says why so)."""

from django.db import migrations, models

from versions import triggers


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("catalog", "0009_node_last_seen_moved_to_agent_contact"),
        ("operations", "0005_agent_contact"),
        ("telemetry", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Version",
            fields=[
                ("area", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("n", models.BigIntegerField(default=0)),
                ("born", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(triggers.install, triggers.uninstall),
    ]
