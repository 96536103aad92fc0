"""The table of the "throttle" cache (llmgw_web/settings.py): the API's rate counts, shared by every
web process. Made here, whatever LLMGW_REDIS_URL says today, so a deployment that moves from Redis back
to the database finds it; ``manage.py createcachetable`` makes the same table (and says it is there)."""

from django.core.management import call_command
from django.db import migrations

TABLE = "access_throttle_cache"


def make_table(apps, schema_editor):
    call_command("createcachetable", TABLE, database=schema_editor.connection.alias, verbosity=0)


def drop_table(apps, schema_editor):
    schema_editor.execute(f"DROP TABLE IF EXISTS {schema_editor.quote_name(TABLE)}")


class Migration(migrations.Migration):
    dependencies = [("access", "0002_roles")]

    operations = [migrations.RunPython(make_table, drop_table)]
