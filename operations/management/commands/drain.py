from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from base.commands import ActorCommand
from operations.management.follow import follow
from operations.services.drain import node_drain, node_drain_plan
from operations.services.start import MAX_PARALLEL


class Command(ActorCommand):
    help = (
        "Drain a node: cordon it and move each of its replicas to other nodes, rolling (one restart per "
        "profile, run by the worker). Shows each restart live until it ends and exits 1 unless every replica "
        "was moved; refused whole (nothing started, the node as it was) when one has no place elsewhere or "
        "nothing on it can be moved. --dry-run says where each replica would go and changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("node", help="the node's name")
        parser.add_argument(
            "--max-parallel",
            type=int,
            default=1,
            metavar="N",
            help=f"replicas moved at once, 1 to {MAX_PARALLEL}",
        )
        parser.add_argument(
            "--ready-timeout",
            type=float,
            default=600,
            metavar="SECONDS",
            help="seconds a replacement has to be ready",
        )
        parser.add_argument("--no-wait", action="store_true", help="start the moves and exit")
        parser.add_argument(
            "--dry-run", action="store_true", help="say where each replica would go; change nothing"
        )

    def act(self, *args: Any, **options: Any) -> None:
        if options["dry_run"]:
            moves = node_drain_plan(node_name=options["node"], max_parallel=options["max_parallel"])
            self.stdout.write(f"a drain of {options['node']} would move (nothing changed):")
            for move in moves:
                self.stdout.write(f"  {move.text}")
            return
        operations = node_drain(
            node_name=options["node"],
            max_parallel=options["max_parallel"],
            ready_timeout=options["ready_timeout"],
        )
        self.stdout.write(f"{options['node']} is cordoned")
        for op in operations:
            self.stdout.write(f"restart #{op.pk} of {op.model.name} queued: {op.cause}")
        if options["no_wait"]:
            return
        failed = []
        for op in operations:
            try:
                follow(op.pk, self.stdout, self.stderr)
            except CommandError as exc:
                if exc.returncode != 1:
                    raise
                failed.append(str(exc))
        if failed:
            raise CommandError("; ".join(failed), returncode=1)
        self.stdout.write(f"{options['node']} is drained: every replica on it was moved")
