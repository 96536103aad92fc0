"""The append-only audit log: one entry per change, chained by hash."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from base.actor import Via


class AuditLogIsAppendOnly(Exception):
    """Raised on any attempt to change or remove an audit entry."""


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> int:
        raise AuditLogIsAppendOnly("audit entries are never updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AuditLogIsAppendOnly("audit entries are never deleted")


def via_is_valid(name: str) -> models.CheckConstraint:
    """The database's own check that a ``via`` column holds one of ``Via``."""
    return models.CheckConstraint(condition=Q(via__in=Via.values), name=name)


class AuditEntry(models.Model):
    at = models.DateTimeField(db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        related_name="+",
        # An account with a history is deactivated, not deleted: the log is never rewritten.
        on_delete=models.PROTECT,
    )
    actor = models.CharField(
        max_length=150, help_text="The user name, or the command's or worker's name, copied."
    )
    via = models.CharField(max_length=8, choices=Via.choices)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64, db_index=True)
    object_key = models.CharField(max_length=200, db_index=True)
    object_repr = models.CharField(max_length=300)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    message = models.TextField(blank=True, default="")
    request_id = models.CharField(max_length=64, blank=True, default="", db_index=True)
    # The database transaction that wrote the entry (PostgreSQL: set by a trigger, catalog row changes
    # carry the same id); not hashed: the row triggers' record is checked against it, not the chain.
    txid = models.BigIntegerField(null=True, blank=True, editable=False)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "audit entries"
        # Leads read the log (the model's own view permission) and export it (this one); the roles that
        # carry them are issue 12's groups, the pages that check them issue 13's.
        permissions = [("export_auditentry", "Can export audit entries")]
        constraints = [via_is_valid("audit_via_valid")]
        # The audit list's filters, each with the id after it: a filtered keyset page (newest or
        # oldest first, any depth) is one range scan of one of these (audit/selectors.py).
        indexes = [
            models.Index(fields=["actor", "id"], name="audit_actor_id"),
            models.Index(fields=["object_type", "id"], name="audit_type_id"),
            models.Index(fields=["object_type", "object_key", "id"], name="audit_type_key_id"),
            models.Index(fields=["object_key", "id"], name="audit_key_id"),
            models.Index(fields=["action", "id"], name="audit_action_id"),
            models.Index(fields=["via", "id"], name="audit_via_id"),
            models.Index(fields=["request_id", "id"], name="audit_request_id"),
            models.Index(fields=["at", "id"], name="audit_at_id"),
            models.Index(fields=["txid"], name="audit_txid"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_type} {self.object_key}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AuditLogIsAppendOnly("audit entries are never updated")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AuditLogIsAppendOnly("audit entries are never deleted")

    def canonical(self) -> bytes:
        """What the hash covers: the content and the previous entry's hash, in one fixed spelling."""
        content = {
            "prev": self.prev_hash,
            "at": self.at.isoformat(),
            "user_id": self.user_id,
            "actor": self.actor,
            "via": self.via,
            "action": self.action,
            "object_type": self.object_type,
            "object_key": self.object_key,
            "object_repr": self.object_repr,
            "before": self.before,
            "after": self.after,
            "message": self.message,
            "request_id": self.request_id,
        }
        return json.dumps(content, sort_keys=True, separators=(",", ":"), default=str).encode()

    def compute_hash(self, key: bytes | None = None) -> str:
        """The entry's hash: HMAC-SHA256 with ``key``; without one, the plain SHA-256 of entries
        written before keyed hashes (anyone with the database can recompute those)."""
        if key is None:
            return hashlib.sha256(self.canonical()).hexdigest()
        return hmac.new(key, b"llmgw-audit-entry\n" + self.canonical(), hashlib.sha256).hexdigest()

    @property
    def action_label(self) -> str:
        """The action in the operators' words (audit/words.py)."""
        from audit.words import action_label

        return action_label(self.action)

    @property
    def object_type_label(self) -> str:
        from audit.words import object_type_label

        return object_type_label(self.object_type)


class RowChange(models.Model):
    """A row of a catalog table inserted, updated or deleted, as the database's own trigger saw it
    (PostgreSQL only: audit/migrations/0005). Append-only like the log. A change whose transaction
    wrote no audit entry was made outside the application (``OutsideChange``)."""

    at = models.DateTimeField()
    txid = models.BigIntegerField()
    table_name = models.CharField(max_length=64)
    operation = models.CharField(max_length=8)
    row_key = models.CharField(max_length=64, blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    db_role = models.CharField(max_length=64, help_text="The database role that connected (session_user).")

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["txid"], name="audit_rowchange_txid")]

    def __str__(self) -> str:
        return f"{self.table_name} {self.operation} {self.row_key} (transaction {self.txid})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise AuditLogIsAppendOnly("row changes are written by the database's triggers only")

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AuditLogIsAppendOnly("row changes are never deleted")


class OutsideChange(models.Model):
    """A row change whose transaction, as it committed, had written no audit entry: made outside the
    application. Written by the database alone (PostgreSQL: a trigger deferred to the commit on each row
    change, audit/migrations/0007), so that reading them is a scan of these few rows, never an anti-join of
    every row change against the whole log. Append-only like the log."""

    change = models.OneToOneField(
        RowChange, primary_key=True, on_delete=models.DO_NOTHING, related_name="outside"
    )

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-change"]

    def __str__(self) -> str:
        return f"row change #{self.pk}, made outside the application"

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise AuditLogIsAppendOnly(
            "changes outside the application are recorded by the database's triggers only"
        )

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AuditLogIsAppendOnly("changes outside the application are never deleted")
