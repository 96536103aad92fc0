from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db import DEFAULT_DB_ALIAS
from django.db.models.signals import post_migrate


class AuditConfig(AppConfig):
    """The append-only, hash-chained audit log and who is acting (docs/design.md, "The audit log")."""

    name = "audit"
    verbose_name = "Audit log"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import checks  # noqa: F401 - registers the deploy checks

        post_migrate.connect(first_checkpoint, sender=self, dispatch_uid="audit.first_checkpoint")


def first_checkpoint(
    sender: AppConfig,
    *,
    using: str = DEFAULT_DB_ALIAS,
    plan: Any = None,
    apps: Any = None,
    verbosity: int = 1,
    stdout: Any = None,
    **kwargs: Any,
) -> None:
    """After ``migrate``, the log's first signed checkpoint, when LLMGW_AUDIT_CHECKPOINT_FILE holds none:
    so that ``audit_verify`` has one to check against from the start (and says so when it has none).

    Only after ``migrate`` (``flush`` sends the signal too, with no plan), on the default database, and
    only when the migrations leave the log's table as this code reads it (not after ``migrate audit
    0005``, say). Writes nothing when the file holds a line already: run it as often as you like."""
    from django.conf import settings

    from audit.chain import write_first_checkpoint
    from audit.models import AuditEntry

    if plan is None or using != DEFAULT_DB_ALIAS or apps is None:
        return
    try:
        state = apps.get_model("audit", "AuditEntry")
    except LookupError:
        return
    columns = {f.column for f in AuditEntry._meta.concrete_fields}
    if (
        state._meta.db_table != AuditEntry._meta.db_table
        or {f.column for f in state._meta.concrete_fields} != columns
    ):
        return
    path = settings.LLMGW_AUDIT_CHECKPOINT_FILE
    try:
        written = write_first_checkpoint(path)
    except OSError as exc:  # the migrations are applied: say what is missing rather than fail them
        if stdout is not None:
            stdout.write(
                f"  The audit log's first checkpoint could not be written to {path} ({exc}): run "
                "audit_checkpoint where LLMGW_AUDIT_CHECKPOINT_FILE can be written; until then audit_verify "
                "says it has none."
            )
        return
    if written is not None and verbosity >= 1 and stdout is not None:
        stdout.write(
            f"  The audit log's first checkpoint written to {path}: {written.count} entries up to "
            f"#{written.last_id}."
        )
