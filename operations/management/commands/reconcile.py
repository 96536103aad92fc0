from __future__ import annotations

import time
from typing import Any

from django.core.management.base import CommandError, CommandParser

from base.commands import ActorCommand
from catalog.models import Node
from operations.services.reconcile import Report, reconcile, reconciler_actor


class Command(ActorCommand):
    help = (
        "One reconciler pass now (the workers run one every LLMGW_RECONCILE_SECONDS): ask every node's agent "
        "what it runs and bring the catalog in line, audited as the reconciler's; print what changed, the "
        "unreachable nodes and the orphans. Exits 1 when a node's agent did not answer."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--node", action="append", default=None, metavar="NAME", help="only this node")
        parser.add_argument(
            "--loop",
            type=float,
            default=None,
            metavar="SECONDS",
            help="pass again every SECONDS until interrupted: for a task backend other than the database's "
            "(with it, the workers schedule the reconciler themselves)",
        )

    def act(self, *args: Any, **options: Any) -> None:
        nodes = None
        if options["node"]:
            nodes = list(Node.objects.filter(name__in=options["node"]).order_by("name"))
            missing = set(options["node"]) - {n.name for n in nodes}
            if missing:
                raise CommandError(f"No node {', '.join(sorted(missing))} in the catalog.")
        while options["loop"] is not None:
            self._say(reconcile(nodes=nodes, actor=reconciler_actor()))
            time.sleep(max(options["loop"], 0.5))
        report = reconcile(nodes=nodes, actor=reconciler_actor())
        self._say(report)
        down = [n for n in report.nodes if not n.reachable]
        if down:
            raise CommandError("; ".join(f"{n.node} unreachable: {n.reason}" for n in down), returncode=1)

    def _say(self, report: Report) -> None:
        for node in report.nodes:
            for change in node.changed:
                self.stdout.write(change)
            if node.orphans:
                self.stdout.write(
                    f"{node.node}: orphans (run by its agent, not in the catalog): {', '.join(node.orphans)}"
                )
        down = [n for n in report.nodes if not n.reachable]
        self.stdout.write(f"{len(report.nodes)} node(s) reconciled, {len(down)} unreachable")
