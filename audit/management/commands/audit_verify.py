from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.chain import CheckpointRefused, chain_problems, latest_checkpoint
from audit.models import AuditEntry
from audit.selectors import changed_outside


class Command(BaseCommand):
    help = (
        "Check the audit log: every entry must match its keyed hash (an HMAC with LLMGW_AUDIT_KEY, which the "
        "database never holds) and carry the hash of the entry before it, and the log must end where the "
        "latest signed checkpoint (audit_checkpoint) says it did. Exits 1 naming the first entry that does "
        "not match, then every other. DETECTS, even by someone with full database access (triggers off, "
        "superuser): an entry altered; an entry removed, inserted or moved; an entry forged or the chain "
        "rewritten with recomputed hashes (they need the key); the newest entries removed, as far as the "
        "latest checkpoint goes; the whole log emptied; a checkpoint line edited or forged; on PostgreSQL, a "
        "catalog row changed with no audit entry in its transaction (listed as changed outside the "
        "application; also on /audit/outside/). CANNOT DETECT: "
        "the newest entries written after the latest checkpoint being removed (the worker writes one every "
        "LLMGW_AUDIT_CHECKPOINT_SECONDS; that is the window); anything by whoever holds LLMGW_AUDIT_KEY; the "
        "checkpoint file itself being replaced by an older one (keep it, or ship its lines, off the "
        "database's host); entries written before keyed hashes (plain SHA-256) beyond what the "
        "checkpoints recorded of them; on SQLite, any catalog change made outside the application (no row "
        "triggers there); a superuser who turns the row triggers off before changing a catalog row."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--checkpoint",
            default=None,
            help="the checkpoint file to check against (default: LLMGW_AUDIT_CHECKPOINT_FILE); its last line counts",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["checkpoint"] or settings.LLMGW_AUDIT_CHECKPOINT_FILE
        try:
            checkpoint = latest_checkpoint(path)
        except CheckpointRefused as exc:
            raise CommandError(f"the checkpoint cannot be trusted: {exc}", returncode=1) from exc
        problems = chain_problems(checkpoint)
        outside = changed_outside()
        outside_count = outside.count()
        if outside_count:
            listed = "\n  ".join(
                f"{c.at:%Y-%m-%d %H:%M:%S} {c.table_name} {c.operation} row {c.row_key or '-'} by {c.db_role} "
                f"(transaction {c.txid})"
                for c in outside[:50]
            )
            more = (
                f"\n  ... and {outside_count - 50} more (the leads' page /audit/outside/)"
                if outside_count > 50
                else ""
            )
            self.stderr.write(
                f"{outside_count} catalog row change(s) were made outside the application (no audit entry in "
                f"their transaction):\n  {listed}{more}"
            )
        if problems:
            raise CommandError(
                f"the audit log was tampered with: the first entry that does not match is #{problems[0].entry}.\n  "
                + "\n  ".join(str(p) for p in problems),
                returncode=1,
            )
        if outside_count:
            raise CommandError(
                f"the chain is intact, but {outside_count} catalog row change(s) were made outside the application",
                returncode=1,
            )
        count = AuditEntry.objects.count()
        anchored = (
            f"; it ends at or after the checkpoint of {checkpoint.at} ({checkpoint.count} entries up to "
            f"#{checkpoint.last_id})"
            if checkpoint
            else f"; no checkpoint in {path}, so a removed tail would not show (run audit_checkpoint)"
        )
        self.stdout.write(f"the audit log is intact: {count} entries, each chained to the last{anchored}")
