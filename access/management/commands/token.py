"""``manage.py token create|list|revoke``: API tokens for automation, from the command line."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from access.models import Token
from access.services import token_create, token_revoke
from base.commands import ActorCommand


class Command(ActorCommand):
    help = (
        "API tokens (hashed; the secret is printed once, at creation). "
        "create USER --name NAME --days N prints the secret alone on stdout; "
        "list [USER] shows names, keys and expiries; revoke USER NAME stops one at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="make a token and print its secret")
        create.add_argument("user", help="the account the token acts as")
        create.add_argument("--name", required=True, help="what uses the token, e.g. ci-deploy")
        create.add_argument("--days", type=int, default=30, help="days until it expires (30)")
        listing = sub.add_parser("list", help="the tokens, of one user or all")
        listing.add_argument("user", nargs="?", default=None)
        revoke = sub.add_parser("revoke", help="stop a token at once")
        revoke.add_argument("user")
        revoke.add_argument("name")

    def _user(self, username: str) -> Any:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(
                f"No user {username!r}: add the account first (the admin, or manage.py createsuperuser).",
                returncode=1,
            )
        return user

    def act(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "create":
            token, secret = token_create(
                user=self._user(options["user"]), name=options["name"], days=options["days"]
            )
            self.stderr.write(
                f"Token {token.name!r} for {token.user.get_username()}, expires {token.expiry:%Y-%m-%d %H:%M} UTC. "
                "The secret is below, shown this once; send it as 'Authorization: Token <secret>'."
            )
            self.stdout.write(secret)
        elif action == "list":
            tokens = Token.objects.select_related("user").order_by("user__username", "name")
            if options["user"]:
                tokens = tokens.filter(user=self._user(options["user"]))
            now = timezone.now()
            for t in tokens:
                state = "expired" if t.expiry and t.expiry <= now else f"expires {t.expiry:%Y-%m-%d}"
                self.stdout.write(f"{t.user.get_username():<16} {t.name:<24} {t.token_key}…  {state}")
        else:
            token = Token.objects.filter(user=self._user(options["user"]), name=options["name"]).first()
            if token is None:
                raise CommandError(
                    f"{options['user']} has no token named {options['name']!r} (manage.py token list).",
                    returncode=1,
                )
            token_revoke(token=token)
            self.stdout.write(f"Revoked {options['name']!r} of {options['user']}: it no longer works.")
