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
        where.add_argument("--stdout", action="store_true", help="print the line only, write no file")
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
        if options["stdout"]:
            self.stdout.write(checkpoint.line())
            return
        path = options["file"] or settings.LLMGW_AUDIT_CHECKPOINT_FILE
        checkpoint_append(path, checkpoint)
        self.stdout.write(
            f"checkpoint written to {path}: {checkpoint.count} entries up to #{checkpoint.last_id}"
        )
