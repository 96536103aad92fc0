from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from operations.management.follow import follow
from operations.services.rollback import plan_lines, profile_rollback


class Command(ActorCommand):
    help = (
        "Roll a model's profile back to revision N: its settings saved again as a new revision, through "
        "every check a resize passes, audited; the replicas that run those settings already adopt the new "
        "revision without a restart, the others are restarted (the dry run says which, and where); "
        "exits 1 when refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("model", help="the model's name")
        parser.add_argument("revision", type=int, help="the revision whose settings it is to run again")
        parser.add_argument("--profile", required=True, help="the profile to roll back")
        parser.add_argument("--dry-run", action="store_true", help="check everything, change nothing")
        parser.add_argument(
            "--no-wait", action="store_true", help="start the restart and exit, instead of following it"
        )

    def act(self, *args: Any, **options: Any) -> None:
        done = profile_rollback(
            model=options["model"],
            profile=options["profile"],
            revision=options["revision"],
            dry_run=options["dry_run"],
        )
        verb = "would roll" if options["dry_run"] else "rolled"
        self.stdout.write(
            f"{verb} {done.profile} back to revision {done.to_revision}'s settings: revision {done.from_revision} "
            f"→ {done.new_revision}"
            + (f"; restarting: operation #{done.operation}" if done.operation else "")
        )
        for line in plan_lines(done):
            self.stdout.write(f"  {line}")
        if done.operation is not None and not options["dry_run"] and not options["no_wait"]:
            follow(done.operation, self.stdout, self.stderr)
