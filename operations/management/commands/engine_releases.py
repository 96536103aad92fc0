from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.services.release_watch import describe, record_check


class Command(BaseCommand):
    help = (
        "The release watch, now: ask the package index (PyPI's simple API, or LLMGW_PACKAGE_INDEX_URL) for each "
        "engine's newest release, keep the answer (the releases page and /metrics show it), and print each "
        "engine whose newest release is newer than the fleet's default. Exits 1 when there is one, 0 when none; "
        "an engine the index did not answer for is printed, and does not change the exit code."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--index-url",
            default=None,
            metavar="URL",
            help=f"the package index's simple API (default {settings.LLMGW_PACKAGE_INDEX_URL})",
        )
        parser.add_argument("--all", action="store_true", help="print every engine, not only the newer ones")

    def handle(self, *args: Any, **options: Any) -> None:
        url = options["index_url"]
        if url is not None and not url.startswith(("http://", "https://")):
            raise CommandError(f"--index-url must be http(s)://host/simple, not {url!r}")
        check = record_check(url)
        newer = [e for e in check.results if e["newer"]]
        for entry in check.results:
            if entry["newer"] or options["all"]:
                self.stdout.write(describe(entry))
            elif entry["error"] and entry["package"]:
                self.stderr.write(describe(entry))
        if newer:
            raise CommandError(
                f"{len(newer)} engine(s) have a release newer than the fleet's default: "
                + ", ".join(f"{e['engine']} {e['newest']}" for e in newer)
                + ". Change the fleet's default after its dry run.",
                returncode=1,
            )
        self.stdout.write(f"No engine has a release newer than the fleet's default ({check.index_url}).")
