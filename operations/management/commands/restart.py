from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from operations.management.follow import follow
from operations.services.start import MAX_PARALLEL, restart_start


class Command(ActorCommand):
    help = (
        "Restart a model's replicas through the node agents: those running an older profile revision, or the "
        "ones named. A worker runs it (python manage.py db_worker); this shows its steps live until it ends "
        "and exits 1 unless every replica was restarted."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("model", help="the model's name")
        parser.add_argument(
            "--replica",
            dest="replicas",
            action="append",
            metavar="NAME",
            default=None,
            help="a live replica to restart (repeat for several); default: the stale ones",
        )
        parser.add_argument(
            "--in-place",
            action="store_const",
            const=True,
            default=None,
            help="stop each replica before its replacement starts on its cards (the model does "
            "not answer while the new one loads); default: rolling where a node has room",
        )
        parser.add_argument(
            "--rolling",
            dest="in_place",
            action="store_const",
            const=False,
            help="rolling only: a replica with no room beside it is not restarted",
        )
        parser.add_argument(
            "--max-parallel",
            type=int,
            default=1,
            metavar="N",
            help=f"replicas restarted at once, 1 to {MAX_PARALLEL} (default 1)",
        )
        parser.add_argument(
            "--ready-timeout",
            type=float,
            default=600,
            metavar="SECONDS",
            help="seconds a replacement has to become ready (default 600)",
        )
        parser.add_argument(
            "--settle",
            type=float,
            default=None,
            metavar="SECONDS",
            help="seconds a replacement must stay ready before its old replica is stopped "
            "(default: LLMGW_RESTART_SETTLE_SECONDS)",
        )
        parser.add_argument(
            "--stop-at-first-failure",
            action="store_true",
            help="start no new step once one failed (default: every replica is still tried, so a fault on "
            "one node does not leave the others on the old revision)",
        )
        parser.add_argument(
            "--no-wait",
            action="store_true",
            help="start the restart and exit; follow it in the pages or at /api/operations/ID/",
        )

    def act(self, *args: Any, **options: Any) -> None:
        op = restart_start(
            model_name=options["model"],
            replicas=options["replicas"],
            in_place=options["in_place"],
            max_parallel=options["max_parallel"],
            ready_timeout=options["ready_timeout"],
            settle_seconds=options["settle"],
            stop_at_first_failure=options["stop_at_first_failure"],
        )
        names = ", ".join(
            s.old_replica.name for s in op.steps.select_related("old_replica") if s.old_replica is not None
        )
        self.stdout.write(f"restart #{op.pk} of {op.model.name} queued: {names} ({op.mode})")
        if options["no_wait"]:
            self.stdout.write(f"follow it: /operations/{op.pk}/ (pages) or /api/operations/{op.pk}/")
            return
        follow(op.pk, self.stdout, self.stderr)
