"""The audit log and restart operations move to their own apps (audit, operations).

State only: the tables stay where they are, under their names, with their
rows; audit/0001 and operations/0001 take the models over.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("catalog", "0003_restart_operations")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name="restartoperation",
                    name="model",
                ),
                migrations.RemoveField(
                    model_name="restartoperation",
                    name="profile",
                ),
                migrations.RemoveField(
                    model_name="restartoperation",
                    name="requested_by",
                ),
                migrations.RemoveField(
                    model_name="restartstep",
                    name="operation",
                ),
                migrations.RemoveField(
                    model_name="restartstep",
                    name="new_replica",
                ),
                migrations.RemoveField(
                    model_name="restartstep",
                    name="old_replica",
                ),
                migrations.DeleteModel(
                    name="AuditEntry",
                ),
                migrations.DeleteModel(
                    name="RestartOperation",
                ),
                migrations.DeleteModel(
                    name="RestartStep",
                ),
            ],
            database_operations=[],
        ),
    ]
