from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from operations.management.follow import follow
from operations.services.drain import replica_move, replica_move_plan


class Command(ActorCommand):
    help = (
        "Move a live (or unknown) replica to another node of its class (--to NODE, or the best fit): its "
        "replacement starts there and is ready before it stops. Shows the restart live and exits 1 unless the "
        "replica was moved. --dry-run says where it would go and changes nothing."
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
        parser.add_argument("--to", metavar="NODE", default=None, help="the node to move it to")
        parser.add_argument("--dry-run", action="store_true", help="say where it would go; change nothing")

    def act(self, *args: Any, **options: Any) -> None:
        if options["dry_run"]:
            move = replica_move_plan(replica_name=options["replica"], to_node=options["to"])
            self.stdout.write(f"a move would take (nothing changed): {move.text}")
            return
        op = replica_move(
            replica_name=options["replica"], to_node=options["to"], ready_timeout=options["ready_timeout"]
        )
        self.stdout.write(f"restart #{op.pk} of {op.model.name} queued: {op.cause}")
        if not options["no_wait"]:
            follow(op.pk, self.stdout, self.stderr)
