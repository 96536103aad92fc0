"""The audit log leaves the catalog app for its own: the same table, rows, triggers and permissions.

The table keeps its name (``catalog_auditentry``) and so do its indexes,
constraints and the append-only triggers of catalog/0002: only Django's
record of which app holds the model changes (state only, no SQL). The
content type moves with it, so permissions granted on audit entries stay
granted.
"""

from django.conf import settings
from django.db import migrations, models
import django.db.models.deletion


def move_content_type(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="audit", model="auditentry").exists():
        ContentType.objects.filter(app_label="catalog", model="auditentry").update(app_label="audit")


def move_content_type_back(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    if not ContentType.objects.filter(app_label="catalog", model="auditentry").exists():
        ContentType.objects.filter(app_label="audit", model="auditentry").update(app_label="catalog")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("catalog", "0004_audit_and_restarts_leave_for_their_apps"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AuditEntry",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("at", models.DateTimeField(db_index=True)),
                        (
                            "actor",
                            models.CharField(
                                help_text="The user name, or the command's or worker's name, copied.",
                                max_length=150,
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
                        ("action", models.CharField(db_index=True, max_length=64)),
                        ("object_type", models.CharField(db_index=True, max_length=64)),
                        ("object_key", models.CharField(db_index=True, max_length=200)),
                        ("object_repr", models.CharField(max_length=300)),
                        ("before", models.JSONField(blank=True, null=True)),
                        ("after", models.JSONField(blank=True, null=True)),
                        ("message", models.TextField(blank=True, default="")),
                        (
                            "request_id",
                            models.CharField(blank=True, db_index=True, default="", max_length=64),
                        ),
                        ("prev_hash", models.CharField(max_length=64)),
                        ("hash", models.CharField(max_length=64, unique=True)),
                        (
                            "user",
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
                        "verbose_name_plural": "audit entries",
                        "db_table": "catalog_auditentry",
                        "ordering": ["-id"],
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(("via__in", ["ui", "api", "admin", "cli", "worker"])),
                                name="audit_via_valid",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_content_type, move_content_type_back),
    ]
