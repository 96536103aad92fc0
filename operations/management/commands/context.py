from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from operations.management.commands._change import describe
from operations.management.follow import follow
from operations.services.resize import model_set_context


class Command(ActorCommand):
    help = (
        "Change a model's context length (the engine's context flag), memory checked; exits 1 when refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("model", help="the model's name")
        parser.add_argument("tokens", type=int, help="context length in tokens")
        parser.add_argument(
            "--profile", default=None, help="the profile, when the model has several on cards"
        )
        parser.add_argument(
            "--in-place",
            action="store_true",
            help="restart each replica in place when no node has room beside it",
        )
        parser.add_argument("--dry-run", action="store_true", help="check everything, change nothing")
        parser.add_argument(
            "--no-wait",
            action="store_true",
            help="start the restart the change asks for and exit; by default its steps show live until it "
            "ends, and the command exits 1 unless every replica was restarted",
        )

    def act(self, *args: Any, **options: Any) -> None:
        change = model_set_context(
            name=options["model"],
            tokens=options["tokens"],
            profile=options["profile"],
            in_place=options["in_place"],
            dry_run=options["dry_run"],
        )
        self.stdout.write(describe(change, dry_run=options["dry_run"]))
        if change.operation is not None and not options["no_wait"]:
            follow(change.operation, self.stdout, self.stderr)
