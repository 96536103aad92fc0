"""A replica's holder columns (its name, its profile, its rendezvous port) raise the placement's version
as well as the replicas' (``versions.triggers.HOLDER``), so that the answers showing who holds each card
and not the replicas' states (the nodes' summary, the compact grid) can be kept under the placement's:
before, a replica moved to another profile in place (a PATCH of /api/replicas/) left the nodes'
summary as it was until the next write of a card or a shard."""

from django.db import migrations

from versions import triggers


class Migration(migrations.Migration):
    dependencies = [("versions", "0005_fleet_and_models_apart")]

    operations = [migrations.RunPython(triggers.install_holder, triggers.uninstall_holder)]
