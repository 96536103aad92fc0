from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from base.commands import ActorCommand
from catalog.services.cards import card_cordon


class Command(ActorCommand):
    help = (
        "Cordon one card of a node (a bad card: Xid or ECC errors): no new replica is placed on it; what "
        "runs on it keeps running, and the node's other cards take placements. Exits 1 when refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("node", help="the node's name")
        parser.add_argument("index", type=int, help="the card's index on the node (nvidia-smi's)")
        parser.add_argument("--reason", default="", help="why, e.g. 'Xid 79' (shown beside the card)")

    def act(self, *args: Any, **options: Any) -> None:
        card = card_cordon(node_name=options["node"], index=options["index"], reason=options["reason"])
        self.stdout.write(f"card {card.index} of {card.node.name} is cordoned: no new placements on it")
