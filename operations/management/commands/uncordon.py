from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from operations.services.drain import node_uncordon


class Command(ActorCommand):
    help = "Uncordon a node: it takes placements again. Exits 1 when refused (it is not cordoned)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("node", help="the node's name")

    def act(self, *args: Any, **options: Any) -> None:
        node = node_uncordon(node_name=options["node"])
        self.stdout.write(f"{node.name} takes placements again")
