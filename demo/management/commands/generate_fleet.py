"""A generated fleet for the benchmark (demo/scale.py): bulk inserts, idempotent."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo.scale import BENCH_USER, Sizes, foreign_rows, generate


class Command(BaseCommand):
    help = (
        "Generate a fleet to measure the pages against: NODES nodes of 8 cards, MODELS models with three "
        "profiles and 16 replicas each (most cards held), finished restarts, and an audit log of AUDIT entries. "
        "Written straight to the database, not audited, every name starting with gen-; running it again adds "
        "only what is missing. Refuses a database whose catalog holds anything it did not generate. "
        f"Signs in as {BENCH_USER} (a superuser it creates)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        d = Sizes()
        parser.add_argument(
            "--nodes", type=int, default=d.nodes, help=f"nodes of 8 cards (default {d.nodes})"
        )
        parser.add_argument("--models", type=int, default=d.models, help=f"models (default {d.models})")
        parser.add_argument(
            "--operations", type=int, default=d.operations, help=f"finished restarts (default {d.operations})"
        )
        parser.add_argument(
            "--audit", type=int, default=d.audit, help=f"audit entries in all, at least (default {d.audit})"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sizes = Sizes(options["nodes"], options["models"], options["operations"], options["audit"])
        for name in ("nodes", "models"):
            if getattr(sizes, name) < 1:
                raise CommandError(f"--{name} must be at least 1.", returncode=2)
        if sizes.models * 2 > sizes.nodes * 8:
            raise CommandError(
                f"{sizes.models} models need more cards than {sizes.nodes} nodes have: give at least "
                f"{-(-sizes.models // 4)} nodes.",
                returncode=2,
            )
        if found := foreign_rows():
            raise CommandError(
                f"This database's catalog holds {', '.join(found)} that this command did not generate: it writes "
                "without auditing, so it only runs on a database of its own (set DATABASE_URL to an empty one).",
                returncode=1,
            )
        generate(sizes, say=lambda line: self.stdout.write(line))
