"""The chain's key and its checkpoints: the tamper evidence of docs/design.md, "The audit log".

Each entry's hash is an HMAC-SHA256 with a key the database never holds
(``LLMGW_AUDIT_KEY``), over its content and the hash of the entry before it:
nobody with only the database can rewrite an entry, or write one, and make
the chain check. What the chain alone cannot show is its end: removing the
newest entries leaves a shorter chain that checks. A *checkpoint* anchors the
end outside the database: the count, the last id and its hash, signed with
the same key, appended to a file (or printed for the operator's log
shipping) by ``audit_checkpoint``, which the worker runs on a schedule;
``migrate`` writes the first (``write_first_checkpoint``). The walks that
check the log against them are ``audit/verify.py``'s.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.models import AuditEntry
from base.db import hold_lock
from base.secrets import audit_key

__all__ = [
    "CHAIN_LOCK_KEY",
    "GENESIS_HASH",
    "Checkpoint",
    "CheckpointRefused",
    "audit_key",
    "checkpoint_append",
    "checkpoint_now",
    "latest_checkpoint",
    "write_first_checkpoint",
]

GENESIS_HASH = "0" * 64
# One lock for the chain: each entry must see the hash of the one committed before it.
CHAIN_LOCK_KEY = 0x6C6C6D67  # "llmg"


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _signature(body: dict[str, Any]) -> str:
    unsigned = {k: v for k, v in body.items() if k != "signature"}
    return hmac.new(
        audit_key(), b"llmgw-audit-checkpoint\n" + _canonical(unsigned), hashlib.sha256
    ).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    """The chain's end as it was: ``count`` entries up to ``last_id`` (0: none), the first ``plain`` of
    them from before keyed hashes (the only entries a plain SHA-256 hash is accepted on)."""

    at: str
    count: int
    last_id: int
    last_hash: str
    plain: int

    def as_dict(self) -> dict[str, Any]:
        body = {
            "version": 1,
            "at": self.at,
            "count": self.count,
            "last_id": self.last_id,
            "last_hash": self.last_hash,
            "plain": self.plain,
        }
        return {**body, "signature": _signature(body)}

    def line(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)


class CheckpointRefused(Exception):
    """A checkpoint file that cannot be trusted or read; the sentence says which line and why."""


def checkpoint_now() -> Checkpoint:
    """The chain's end now. Holds the chain's lock, so no entry commits while it is read."""
    with transaction.atomic():
        hold_lock(CHAIN_LOCK_KEY)
        last = AuditEntry.objects.order_by("-id").values_list("id", "hash").first()
        return Checkpoint(
            at=timezone.now().isoformat(),
            count=AuditEntry.objects.count(),
            last_id=last[0] if last else 0,
            last_hash=last[1] if last else GENESIS_HASH,
            plain=_leading_plain(),
        )


def _leading_plain() -> int:
    """How many entries, from the first, were written before keyed hashes (their hash is plain SHA-256).
    Stops at the first keyed one: on a log begun with keyed hashes, one entry is read."""
    key = audit_key()
    plain = 0
    for entry in AuditEntry.objects.order_by("id").iterator(chunk_size=500):
        if hmac.compare_digest(entry.compute_hash(key), entry.hash) or entry.compute_hash() != entry.hash:
            break
        plain += 1
    return plain


def checkpoint_append(path: str | Path, checkpoint: Checkpoint) -> None:
    """Append the checkpoint's line to ``path`` and flush it to disk."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as out:
        out.write(checkpoint.line() + "\n")
        out.flush()
        os.fsync(out.fileno())


def latest_checkpoint(path: str | Path) -> Checkpoint | None:
    """The last checkpoint of ``path`` (None: no file, or no line yet). Every line's signature is
    checked: one that does not match (forged, edited, or signed with another key) refuses the file.
    So does a line counting another number of entries from before keyed hashes than the first line
    did: the application never writes one, so more of them means entries rewritten without the key
    between the two checkpoints (and a checkpoint written after the rewrite does not bless it)."""
    target = Path(path)
    if not target.exists():
        return None
    latest: Checkpoint | None = None
    first: tuple[int, Checkpoint] | None = None
    for number, text in enumerate(target.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            body = json.loads(text)
            checkpoint = Checkpoint(
                at=str(body["at"]),
                count=int(body["count"]),
                last_id=int(body["last_id"]),
                last_hash=str(body["last_hash"]),
                plain=int(body["plain"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointRefused(f"{target} line {number} is not a checkpoint ({exc}).") from exc
        if not hmac.compare_digest(str(body.get("signature", "")), _signature(body)):
            raise CheckpointRefused(
                f"{target} line {number}: its signature does not match: the line was edited or forged, or "
                "signed with another LLMGW_AUDIT_KEY."
            )
        if first is None:
            first = (number, checkpoint)
        elif checkpoint.plain != first[1].plain:
            raise CheckpointRefused(
                f"{target} line {number}, the checkpoint of {checkpoint.at}, counts {checkpoint.plain} entries "
                f"with a plain hash (from before keyed hashes) where line {first[0]}, of {first[1].at}, counted "
                f"{first[1].plain}: the log's first entries were rewritten without the key between the two."
            )
        latest = checkpoint
    return latest


def has_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` holds a line (trusted or not: ``latest_checkpoint`` judges it)."""
    target = Path(path)
    if not target.exists():
        return False
    with target.open(encoding="utf-8") as lines:
        return any(line.strip() for line in lines)


def write_first_checkpoint(path: str | Path) -> Checkpoint | None:
    """Append a checkpoint of the log as it is to ``path`` when it holds none yet, and answer it; None
    (nothing written) when it holds one. Run at migrate time, so a log is anchored from its start."""
    if has_checkpoint(path):
        return None
    checkpoint = checkpoint_now()
    checkpoint_append(path, checkpoint)
    return checkpoint
