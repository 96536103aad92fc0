from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from operations.tasks import operations_sweep


class Command(BaseCommand):
    help = (
        "Enqueue a run for every restart operation no live worker holds (its worker was killed, or its task was "
        "lost), so that a running worker takes it over. Safe to run at any time, from any host; --loop keeps "
        "doing it (the demo launcher does that)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop",
            type=float,
            default=None,
            metavar="SECONDS",
            help="sweep again every SECONDS until interrupted",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        while True:
            for operation_id in operations_sweep():
                self.stdout.write(f"restart #{operation_id}: no live worker held it; a run is enqueued")
            if options["loop"] is None:
                return
            time.sleep(max(options["loop"], 0.5))
