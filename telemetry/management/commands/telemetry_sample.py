from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from telemetry.services import fleet_sample


class Command(BaseCommand):
    help = (
        "Read every node's card telemetry from its agent (memory used, utilisation, temperature, the "
        "processes holding each card) and keep it: once, or every --loop seconds. Exits 1 when a node "
        "did not answer (a single run)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop",
            type=float,
            default=None,
            metavar="SECONDS",
            help="sample again every SECONDS (at least 1) until stopped",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        loop = options["loop"]
        if loop is not None and loop < 1:
            raise CommandError(f"--loop must be at least 1 second, not {loop:g}.")
        while True:
            began = time.monotonic()
            answered = fleet_sample()
            took = time.monotonic() - began
            silent = sorted(name for name, ok in answered.items() if not ok)
            self.stdout.write(
                f"{len(answered) - len(silent)} of {len(answered)} node(s) answered"
                + (f"; not: {', '.join(silent)}" if silent else "")
            )
            if loop is None:
                if silent:
                    raise CommandError(f"No telemetry from {', '.join(silent)}.", returncode=1)
                return
            # As the worker's: a round stays under a third of its interval (telemetry/services.py).
            time.sleep(max(0.0, max(loop, 3.0 * took) - took))
