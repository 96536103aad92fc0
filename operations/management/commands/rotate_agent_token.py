"""``manage.py rotate_agent_token NODE``: a new agent token, without downtime."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from base.commands import ActorCommand
from catalog.models import Node
from operations.services.agent_token import node_rotate_token


class Command(ActorCommand):
    help = (
        "Give a node's agent a new token: the agent takes it and accepts the old one for the grace "
        "period, confirms with the new one, and only then is it saved here. Exits 1 when it was not rotated."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("node", help="the node's name")
        parser.add_argument(
            "--grace", type=float, default=300.0, help="seconds the agent keeps accepting the old token (300)"
        )

    def act(self, *args: Any, **options: Any) -> None:
        node = Node.objects.filter(name=options["node"]).first()
        if node is None:
            raise CommandError(f"No node {options['node']!r} in the catalog.", returncode=1)
        node_rotate_token(instance=node, grace_seconds=options["grace"])
        self.stdout.write(
            f"Rotated the agent token of {node.name}; the agent accepts the old one for {options['grace']:g} s."
        )
