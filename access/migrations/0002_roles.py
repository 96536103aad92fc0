"""The roles as groups with their permissions (base/roles.py), and DRF's plain-text token table
dropped: API tokens are knox's now, stored as hashes (access.Token). Tokens of the old table stop
working; make new ones with ``manage.py token create``."""

from django.db import migrations

from base.roles import sync_roles_in_migration


def forget_authtoken(apps, schema_editor):
    # Its content type and permissions, and the record of its migrations: the app is gone.
    apps.get_model("contenttypes", "ContentType").objects.filter(app_label="authtoken").delete()
    schema_editor.execute("DELETE FROM django_migrations WHERE app = 'authtoken'")


class Migration(migrations.Migration):
    dependencies = [
        ("access", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("catalog", "0006_replica_planned_measured"),
        ("operations", "0002_step_planned_place"),
        ("audit", "0002_export_permission"),
    ]

    operations = [
        # Back: the groups stay, with their members (a role is not undone by undoing its migration).
        migrations.RunPython(sync_roles_in_migration, migrations.RunPython.noop),
        migrations.RunSQL("DROP TABLE IF EXISTS authtoken_token", migrations.RunSQL.noop),
        migrations.RunPython(forget_authtoken, migrations.RunPython.noop),
    ]
