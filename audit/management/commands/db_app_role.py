from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from audit.roles import append_only_tables, grant_app_role


class Command(BaseCommand):
    help = (
        "PostgreSQL: give ROLE, the role the application connects as, what it needs and no more: read and "
        "write every table of the schema except the append-only ones ("
        + ", ".join(append_only_tables())
        + "), which it may only read and append to. Run it as the tables' owner (the role that migrates), "
        "after every migrate. ROLE owns nothing, so it cannot drop or disable the audit log's triggers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("role", help="the application's role, created beforehand (CREATE ROLE ... LOGIN)")

    def handle(self, *args: Any, role: str, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError(
                f"roles are PostgreSQL's: this database is {connection.vendor}, nothing was granted"
            )
        try:
            with transaction.atomic():
                grant_app_role(role)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"{role} may now read and write the application's tables, and only read and append to {append_only_tables()[0]}"
        )
