from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from operations.management.follow import follow
from operations.services.drain import replica_move


class Command(ActorCommand):
    help = (
        "Move a live replica to another node: its replacement starts there and is ready before it stops. "
        "Shows the restart live and exits 1 unless the replica was moved."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("replica", help="the replica's name")
        parser.add_argument(
            "--ready-timeout",
            type=float,
            default=600,
            metavar="SECONDS",
            help="seconds the replacement has to be ready",
        )
        parser.add_argument("--no-wait", action="store_true", help="start the move and exit")

    def act(self, *args: Any, **options: Any) -> None:
        op = replica_move(replica_name=options["replica"], ready_timeout=options["ready_timeout"])
        self.stdout.write(f"restart #{op.pk} of {op.model.name} queued: {op.cause}")
        if not options["no_wait"]:
            follow(op.pk, self.stdout, self.stderr)
