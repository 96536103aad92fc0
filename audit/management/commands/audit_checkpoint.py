from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from audit.chain import checkpoint_append, checkpoint_now


class Command(BaseCommand):
    help = (
        "Write a signed checkpoint of the audit log's end (count, last id, last hash; HMAC with "
        "LLMGW_AUDIT_KEY) as one JSON line, appended to LLMGW_AUDIT_CHECKPOINT_FILE or printed for your log "
        "shipping; audit_verify checks the log against the latest. --schedule puts the worker's recurring "
        "checkpoint in the queue (every LLMGW_AUDIT_CHECKPOINT_SECONDS), once after deploying."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--file", default=None, help="append to this file instead of the setting's")
        # Neither named nor stored as "stdout" alone: BaseCommand.execute and call_command take an option of
        # that name for the output stream (as the dest it crashed the command line; as the name, call_command).
        where.add_argument(
            "--print",
            "--stdout",
            dest="print_only",
            action="store_true",
            help="print the line only (to standard output), write no file",
        )
        where.add_argument(
            "--schedule", action="store_true", help="have the worker write one on its schedule"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["schedule"]:
            from audit.tasks import ensure_checkpointer

            due = ensure_checkpointer()
            self.stdout.write(
                f"the worker writes a checkpoint every {settings.LLMGW_AUDIT_CHECKPOINT_SECONDS:g} s; next {due}"
            )
            return
        checkpoint = checkpoint_now()
        if options["print_only"]:
            self.stdout.write(checkpoint.line())
            return
        path = options["file"] or settings.LLMGW_AUDIT_CHECKPOINT_FILE
        checkpoint_append(path, checkpoint)
        self.stdout.write(
            f"checkpoint written to {path}: {checkpoint.count} entries up to #{checkpoint.last_id}"
        )
