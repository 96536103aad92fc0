from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit import verify
from audit.chain import CheckpointRefused, latest_checkpoint
from audit.models import AuditEntry
from audit.selectors import outside_count, outside_page
from audit.verify import Verdict, verify_all, verify_since

LISTED = 50  # row changes made outside the application named one by one; the rest counted


class Command(BaseCommand):
    help = (
        "Check the audit log: every entry must match its keyed hash (an HMAC with LLMGW_AUDIT_KEY, which the "
        "database never holds) and carry the hash of the entry before it, and the log must end where the "
        "latest signed checkpoint (audit_checkpoint; migrate writes the first) says it did. By default only "
        "the checkpoint's own entry and the entries after it are read (seconds, however long the log); "
        "--full reads every entry from the first (minutes on a million, with its progress on standard "
        "error), as does a run with no checkpoint, which says so. Exits 1 naming the first entry that "
        "does not match, then every other. DETECTS, even by someone with full database access (triggers "
        "off, superuser): an entry altered; an entry removed, inserted or moved; an entry forged or the "
        "chain rewritten with recomputed hashes, plain SHA-256 or any other (they need the key; a plain "
        "hash is accepted only on the entries from before keyed hashes that the first checkpoint counted, "
        "and with no checkpoint on none); the newest entries removed, as far as the latest checkpoint "
        "goes; the whole log emptied; a checkpoint line edited or forged; on PostgreSQL, a catalog row "
        "changed with no audit entry in its transaction (listed as changed outside the application; also "
        "on /audit/outside/). Without --full, what comes before the latest checkpoint is checked only "
        "through the checkpoint's entry, its hash and the count before it: a rewrite that reaches it "
        "shows, one that leaves an earlier entry's content altered and its hash as it was shows only "
        "in a --full walk (run one on a schedule). CANNOT DETECT: "
        "the newest entries written after the latest checkpoint being removed (the worker writes one every "
        "LLMGW_AUDIT_CHECKPOINT_SECONDS; that is the window); anything by whoever holds LLMGW_AUDIT_KEY; the "
        "checkpoint file itself being replaced by an older one, or removed with the log's tail (keep it, or "
        "ship its lines, off the database's host); on SQLite, any catalog change made outside the "
        "application (no row triggers there); a superuser who turns the row triggers off before changing a "
        "catalog row."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--checkpoint",
            default=None,
            help="the checkpoint file to check against (default: LLMGW_AUDIT_CHECKPOINT_FILE); its last line counts",
        )
        parser.add_argument(
            "--full",
            action="store_true",
            help="read every entry from the first, not only those after the latest checkpoint",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["checkpoint"] or settings.LLMGW_AUDIT_CHECKPOINT_FILE
        try:
            checkpoint = latest_checkpoint(path)
        except CheckpointRefused as exc:
            raise CommandError(f"the checkpoint cannot be trusted: {exc}", returncode=1) from exc
        if checkpoint is None:
            self.stderr.write(
                f"no signed checkpoint in {path}: every entry is read, and nothing anchors the log's end "
                "(migrate writes the first checkpoint; audit_checkpoint writes one now)"
            )
        progress = self._progress(full=options["full"] or checkpoint is None)
        every = verify.PROGRESS_EVERY
        if options["full"] or checkpoint is None:
            verdict = verify_all(checkpoint, progress=progress, every=every)
        else:
            verdict = verify_since(checkpoint, progress=progress, every=every)
        if verdict.read % every:
            progress(verdict.read)
        outside_count = self._report_outside()
        if verdict.problems:
            raise CommandError(
                f"the audit log was tampered with: the first entry that does not match is "
                f"#{verdict.problems[0].entry}.\n  " + "\n  ".join(str(p) for p in verdict.problems),
                returncode=1,
            )
        if outside_count:
            raise CommandError(
                f"the chain is intact, but {outside_count} catalog row change(s) were made outside the application",
                returncode=1,
            )
        self.stdout.write(self._intact(verdict, path))

    def _progress(self, *, full: bool) -> Any:
        """Says, on standard error, how far the walk is: of how many, when it reads the whole log."""
        total = AuditEntry.objects.count() if full else None
        start = time.monotonic()
        of = f" of {total:,}" if total is not None else ""

        def say(read: int) -> None:
            share = f" ({read / total:.0%})" if total else ""
            self.stderr.write(f"read {read:,}{of} entries{share} in {time.monotonic() - start:.1f} s")

        return say

    def _report_outside(self) -> int:
        listed = outside_page(size=LISTED).entries
        if not listed:
            return 0
        count = outside_count()
        lines = "\n  ".join(
            f"{c.at:%Y-%m-%d %H:%M:%S} {c.table_name} {c.operation} row {c.row_key or '-'} by {c.db_role} "
            f"(transaction {c.txid})"
            for c in listed
        )
        more = (
            f"\n  ... and {count - LISTED} more (the leads' page /audit/outside/)" if count > LISTED else ""
        )
        self.stderr.write(
            f"{count} catalog row change(s) were made outside the application (no audit entry in their "
            f"transaction):\n  {lines}{more}"
        )
        return count

    def _intact(self, verdict: Verdict, path: str) -> str:
        checkpoint = verdict.checkpoint
        # Read whole, the log holds what was read; else the checkpoint's entries and those read after it.
        count = verdict.read if verdict.full or checkpoint is None else checkpoint.count + verdict.read - 1
        if checkpoint is None:
            return (
                f"the audit log is intact: {count} entries, every one read, keyed and chained to the last; "
                f"but no signed checkpoint in {path} anchors its end, so entries removed from its end would "
                "not show (run audit_checkpoint)"
            )
        anchored = (
            f"it ends at or after the checkpoint of {checkpoint.at} ({checkpoint.count} entries up to "
            f"#{checkpoint.last_id})"
        )
        if verdict.full:
            return f"the audit log is intact: {count} entries, every one read, keyed and chained to the last; {anchored}"
        return (
            f"the audit log is intact: {count} entries; {anchored}, whose entry holds the hash and the count "
            f"before it recorded then, and the {verdict.read - 1} after it were read, each keyed and chained "
            "to the last (the entries up to the checkpoint were not read again: --full reads every one)"
        )
