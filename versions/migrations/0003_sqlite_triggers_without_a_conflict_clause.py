"""On SQLite, the version triggers made anew without INSERT OR IGNORE, which an upsert's own
conflict clause overrode (versions/triggers.py); on PostgreSQL nothing changes (install is idempotent)."""

from django.db import migrations

from versions import triggers


class Migration(migrations.Migration):
    dependencies = [("versions", "0002_audit_log")]

    operations = [migrations.RunPython(triggers.install, migrations.RunPython.noop)]
