"""The base of every command that changes the catalog: it sets who is acting."""

from __future__ import annotations

import getpass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from base.actor import Actor, acting_as
from base.errors import DomainError


def os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): still say something true
        return "unknown"


class ActorCommand(BaseCommand):
    """Runs ``act`` as the command's user (``--as``), audited via cli.

    A DomainError becomes a CommandError: its sentence on stderr, exit 1.
    """

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--as",
            dest="as_user",
            metavar="USER",
            default=None,
            help="who is acting, for the audit log (default: the OS user's name); "
            "a matching account is linked when there is one",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options.get("as_user") or os_user()
        user = get_user_model().objects.filter(username=name).first()
        actor = Actor(via="cli", name=f"{name}", user=user)
        with acting_as(actor):
            try:
                self.act(*args, **options)
            except DomainError as exc:
                raise CommandError(f"{exc.message} [{exc.code}]", returncode=1) from exc

    def act(self, *args: Any, **options: Any) -> None:
        raise NotImplementedError
