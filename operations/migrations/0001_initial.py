"""Restart operations leave the catalog app for their own: the same tables, rows and permissions.

The tables keep their names (``catalog_restartoperation``, ``catalog_restartstep``)
and so do their indexes and constraints: only Django's record of which app
holds the models changes (state only, no SQL). The content types move with
them, so permissions stay granted, and tasks already queued under the old
module path (``catalog.tasks``) are pointed at ``operations.tasks``, so a
worker still runs them.
"""

from django.conf import settings
from django.db import migrations, models
import django.db.models.deletion
import django.utils.timezone

MODELS = ("restartoperation", "restartstep")


def move(apps, schema_editor, *, old, new):
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        if not ContentType.objects.filter(app_label=new, model=model).exists():
            ContentType.objects.filter(app_label=old, model=model).update(app_label=new)
    DBTaskResult = apps.get_model("django_tasks_database", "DBTaskResult")
    for task in ("run_restart", "sweep_restarts"):
        DBTaskResult.objects.filter(task_path=f"{old}.tasks.{task}").update(task_path=f"{new}.tasks.{task}")


def forwards(apps, schema_editor):
    move(apps, schema_editor, old="catalog", new="operations")


def backwards(apps, schema_editor):
    move(apps, schema_editor, old="operations", new="catalog")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("catalog", "0004_audit_and_restarts_leave_for_their_apps"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("django_tasks_database", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="RestartOperation",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("queued", "Queued"),
                                    ("running", "Running"),
                                    ("succeeded", "Succeeded"),
                                    ("failed", "Failed"),
                                    ("partly_failed", "partly failed"),
                                    ("cancelled", "Cancelled"),
                                ],
                                db_index=True,
                                default="queued",
                                max_length=16,
                            ),
                        ),
                        (
                            "in_place",
                            models.BooleanField(
                                blank=True,
                                help_text="True: every replica stops before its replacement starts. False: rolling only (a step with no room beside fails). Empty: rolling where a node has room beside, in place where not.",
                                null=True,
                            ),
                        ),
                        (
                            "max_parallel",
                            models.PositiveSmallIntegerField(default=1, help_text="Steps run at once."),
                        ),
                        (
                            "ready_timeout",
                            models.FloatField(
                                default=600, help_text="Seconds a replacement has to become ready."
                            ),
                        ),
                        (
                            "requested_by_name",
                            models.CharField(
                                help_text="Who asked, copied (user, or command's name).", max_length=150
                            ),
                        ),
                        (
                            "via",
                            models.CharField(
                                choices=[
                                    ("ui", "pages"),
                                    ("api", "API"),
                                    ("admin", "admin"),
                                    ("cli", "command"),
                                    ("worker", "worker"),
                                ],
                                max_length=8,
                            ),
                        ),
                        (
                            "reason",
                            models.TextField(
                                blank=True, default="", help_text="Why it ended as it did, in a sentence."
                            ),
                        ),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "heartbeat_at",
                            models.DateTimeField(
                                blank=True, help_text="Last sign of life of its worker.", null=True
                            ),
                        ),
                        (
                            "worker",
                            models.CharField(
                                blank=True, default="", help_text="The worker holding it.", max_length=200
                            ),
                        ),
                        (
                            "attempts",
                            models.PositiveSmallIntegerField(
                                default=0, help_text="Times a worker claimed it."
                            ),
                        ),
                        ("cancel_requested", models.BooleanField(default=False)),
                        (
                            "task_id",
                            models.CharField(
                                blank=True,
                                default="",
                                help_text="The latest task enqueued for it.",
                                max_length=64,
                            ),
                        ),
                        (
                            "model",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="restarts",
                                to="catalog.servedmodel",
                            ),
                        ),
                        (
                            "profile",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="restarts",
                                to="catalog.profile",
                            ),
                        ),
                        (
                            "requested_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "restart operation",
                        "db_table": "catalog_restartoperation",
                        "ordering": ["-id"],
                    },
                ),
                migrations.CreateModel(
                    name="RestartStep",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "node",
                            models.CharField(
                                blank=True, default="", help_text="Where the replacement runs.", max_length=64
                            ),
                        ),
                        (
                            "cards",
                            models.JSONField(
                                blank=True,
                                default=list,
                                help_text="Card indices of the replacement on its node.",
                            ),
                        ),
                        (
                            "in_place",
                            models.BooleanField(
                                default=False,
                                help_text="The old replica was stopped first, freeing its cards.",
                            ),
                        ),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("pending", "Pending"),
                                    ("starting", "Starting"),
                                    ("waiting", "Waiting"),
                                    ("stopping", "Stopping"),
                                    ("succeeded", "Succeeded"),
                                    ("failed", "Failed"),
                                    ("cancelled", "Cancelled"),
                                ],
                                default="pending",
                                max_length=16,
                            ),
                        ),
                        ("reason", models.TextField(blank=True, default="")),
                        ("spec", models.JSONField(blank=True, null=True)),
                        ("old_spec", models.JSONField(blank=True, null=True)),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "new_replica",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="catalog.replica",
                            ),
                        ),
                        (
                            "old_replica",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="catalog.replica",
                            ),
                        ),
                        (
                            "operation",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="steps",
                                to="operations.restartoperation",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "catalog_restartstep",
                        "ordering": ["operation_id", "id"],
                    },
                ),
                migrations.AddConstraint(
                    model_name="restartoperation",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "state__in",
                                ["queued", "running", "succeeded", "failed", "partly_failed", "cancelled"],
                            )
                        ),
                        name="restart_state_valid",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="restartoperation",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("max_parallel__gte", 1)), name="restart_max_parallel_positive"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="restartoperation",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("ready_timeout__gt", 0)), name="restart_ready_timeout_positive"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="restartoperation",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("state__in", ["queued", "running"])),
                        fields=("model",),
                        name="restart_one_active_per_model",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="restartstep",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "state__in",
                                [
                                    "pending",
                                    "starting",
                                    "waiting",
                                    "stopping",
                                    "succeeded",
                                    "failed",
                                    "cancelled",
                                ],
                            )
                        ),
                        name="restart_step_state_valid",
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
