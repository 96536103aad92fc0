from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from operations.management.commands._change import describe
from operations.management.follow import follow
from operations.services.resize import model_resize


class Command(ActorCommand):
    help = (
        "Resize a model to N cards, of one node or across nodes: every rule is checked first; exits 1 when "
        "refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("model", help="the model's name")
        parser.add_argument("gpus", type=int, help="cards one replica is to use, 1 to 64")
        parser.add_argument(
            "--profile", default=None, help="the profile, when the model has several on cards"
        )
        parser.add_argument(
            "--nodes",
            type=int,
            default=None,
            help="the nodes one replica spans, a rank on each (default: one node when one has the cards, "
            "else the fewest that divide them evenly)",
        )
        parser.add_argument(
            "--in-place",
            action="store_true",
            help="stop each replica before its replacement starts (the model does not answer "
            "while the new one loads)",
        )
        parser.add_argument("--dry-run", action="store_true", help="check everything, change nothing")
        parser.add_argument(
            "--no-wait",
            action="store_true",
            help="start the restart the change asks for and exit; by default its steps show live until it "
            "ends, and the command exits 1 unless every replica was restarted",
        )

    def act(self, *args: Any, **options: Any) -> None:
        change = model_resize(
            name=options["model"],
            gpus=options["gpus"],
            nodes=options["nodes"],
            profile=options["profile"],
            in_place=options["in_place"],
            dry_run=options["dry_run"],
        )
        self.stdout.write(describe(change, dry_run=options["dry_run"]))
        if change.operation is not None and not options["no_wait"]:
            follow(change.operation, self.stdout, self.stderr)
