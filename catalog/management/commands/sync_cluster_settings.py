from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from base.commands import ActorCommand
from catalog.services.cluster_settings import sync_cluster_settings


class Command(ActorCommand):
    help = (
        "Load the models the cluster's settings file declares (LLMGW_CLUSTER_SETTINGS, TOML) and mark them "
        "declared: read-only in the admin, the API and every operation. All or nothing, audited."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--file", type=Path, default=None, help="the settings file (default: LLMGW_CLUSTER_SETTINGS)"
        )

    def act(self, *args: Any, **options: Any) -> None:
        path = options["file"] or Path(settings.LLMGW_CLUSTER_SETTINGS)
        result = sync_cluster_settings(path=path)
        self.stdout.write(
            f"{path}: {len(result.created)} created, {len(result.updated)} updated, "
            f"{len(result.released)} no longer declared"
            + (f" ({', '.join(result.released)})" if result.released else "")
        )
