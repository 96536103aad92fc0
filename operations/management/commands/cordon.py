from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from operations.services.drain import node_cordon


class Command(ActorCommand):
    help = (
        "Cordon a node: no new replica is placed on it; what runs there keeps running. Exits 1 when refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("node", help="the node's name")

    def act(self, *args: Any, **options: Any) -> None:
        node = node_cordon(node_name=options["node"])
        self.stdout.write(f"{node.name} is cordoned: no new placements")
