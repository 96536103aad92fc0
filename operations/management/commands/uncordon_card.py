from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from catalog.services.cards import card_uncordon


class Command(ActorCommand):
    help = "Uncordon one card of a node: it takes placements again. Exits 1 when refused."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("node", help="the node's name")
        parser.add_argument("index", type=int, help="the card's index on the node")

    def act(self, *args: Any, **options: Any) -> None:
        card = card_uncordon(node_name=options["node"], index=options["index"])
        self.stdout.write(f"card {card.index} of {card.node.name} takes placements again")
