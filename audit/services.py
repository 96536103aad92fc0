"""The only place audit entries are written."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection, models
from django.utils import timezone

from audit.chain import CHAIN_LOCK_KEY, GENESIS_HASH, Checkpoint, audit_key
from audit.models import AuditEntry
from audit.verify import chain_problems
from base.actor import Actor, current_actor
from base.db import hold_lock
from base.secrets import fingerprint, fingerprinted_env

__all__ = ["GENESIS_HASH", "audit_record", "audit_records", "changed_fields", "snapshot", "verify_chain"]

SECRET_FIELDS = frozenset({"agent_token"})


def jsonable(value: Any) -> Any:
    """``value`` as it will read back from a JSON column, so the hash is stable."""
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def snapshot(instance: models.Model) -> dict[str, Any]:
    """The object's fields as JSON, foreign keys by their name, secrets masked."""
    out: dict[str, Any] = {}
    for field in instance._meta.concrete_fields:
        if field.primary_key:
            continue
        if field.name in SECRET_FIELDS:
            # A keyed fingerprint, so a rotation shows as a change without the secret in the log, and a
            # reader of the log cannot confirm a guess offline.
            out[field.name] = fingerprint(getattr(instance, field.attname) or "")
        elif field.is_relation:
            related = getattr(instance, field.name)
            out[field.name] = None if related is None else str(related)
        else:
            out[field.name] = getattr(instance, field.attname)
    engine = getattr(instance, "engine", None)
    if isinstance(out.get("env"), dict) and isinstance(engine, str):
        # A profile: the values the launch policy marks secret, as fingerprints.
        out["env"] = fingerprinted_env(engine, out["env"])
    return jsonable(out)


def audit_record(
    *,
    action: str,
    object_type: str,
    object_key: str,
    object_repr: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    message: str = "",
    actor: Actor | None = None,
) -> AuditEntry:
    """Append one entry, chained to the last; must run inside the change's transaction."""
    entry = dict(
        action=action,
        object_type=object_type,
        object_key=object_key,
        object_repr=object_repr,
        before=before,
        after=after,
        message=message,
    )
    return audit_records([entry], actor=actor)[0]


def audit_records(entries: list[dict[str, Any]], *, actor: Actor | None = None) -> list[AuditEntry]:
    """Append ``entries`` (each ``audit_record``'s keywords but the actor) in their order, each
    chained to the one before, in one insert; must run inside the changes' transaction. The chain's
    lock is taken once, so changes made together hold it for one read and one write, not one each."""
    if not connection.in_atomic_block:
        raise RuntimeError("audit_record must run inside the transaction of the change it records")
    actor = actor or current_actor()
    prev = _chain_end()
    key = audit_key()
    written = []
    for fields in entries:
        entry = _entry(actor, prev, **fields)
        entry.hash = prev = entry.compute_hash(key)
        written.append(entry)
    if len(written) == 1:
        written[0].save()
    else:
        AuditEntry.objects.bulk_create(written)  # ids in the list's order: the chain's
    return written


def _chain_end() -> str:
    """Take the chain's lock, then read the hash of the last entry committed. Every audited write
    of the fleet waits for that lock, which each holds from here to its commit: on PostgreSQL the
    two go in one round trip, two statements in one message, the second's snapshot taken once the
    first has the lock (READ COMMITTED takes one a statement), so it is held one round trip less."""
    if connection.vendor != "postgresql":
        hold_lock(CHAIN_LOCK_KEY)  # SQLite: one writer at a time already
        return AuditEntry.objects.order_by("-id").values_list("hash", flat=True).first() or GENESIS_HASH
    table = connection.ops.quote_name(AuditEntry._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT pg_advisory_xact_lock({int(CHAIN_LOCK_KEY)}); "
            f"SELECT hash FROM {table} ORDER BY id DESC LIMIT 1"
        )
        cursor.nextset()
        row = cursor.fetchone()
    return row[0] if row else GENESIS_HASH


def _entry(
    actor: Actor,
    prev: str,
    *,
    action: str,
    object_type: str,
    object_key: str,
    object_repr: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    message: str = "",
) -> AuditEntry:
    return AuditEntry(
        at=timezone.now(),
        user=actor.resolved_user,
        actor=actor.display_name[:150],
        via=actor.via,
        action=action,
        object_type=object_type,
        object_key=str(object_key)[:200],
        object_repr=(object_repr or str(object_key))[:300],
        before=None if before is None else jsonable(before),
        after=None if after is None else jsonable(after),
        message=message,
        request_id=actor.request_id[:64],
        prev_hash=prev,
    )


def changed_fields(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[str]:
    before, after = before or {}, after or {}
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def verify_chain(checkpoint: Checkpoint | None = None) -> list[str]:
    """Each entry that does not match, as a sentence naming it, lowest id first. Empty when intact."""
    return [str(p) for p in chain_problems(checkpoint)]
