from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.models import AuditEntry
from audit.services import verify_chain


class Command(BaseCommand):
    help = (
        "Check the audit log's hash chain: every entry must match its hash and carry the hash of the one "
        "before it. Exits 1, listing each problem, when an entry was altered or removed."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        problems = verify_chain()
        if problems:
            raise CommandError("the audit log was tampered with:\n  " + "\n  ".join(problems), returncode=1)
        self.stdout.write(
            f"the audit log is intact: {AuditEntry.objects.count()} entries, each chained to the last"
        )
