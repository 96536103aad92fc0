"""The chain's key, its check, and its checkpoints: the tamper evidence of docs/design.md, "The audit log".

Each entry's hash is an HMAC-SHA256 with a key the database never holds
(``LLMGW_AUDIT_KEY``), over its content and the hash of the entry before it:
nobody with only the database can rewrite an entry, or write one, and make
the chain check. What the chain alone cannot show is its end: removing the
newest entries leaves a shorter chain that checks. A *checkpoint* anchors the
end outside the database: the count, the last id and its hash, signed with
the same key, appended to a file (or printed for the operator's log
shipping) by ``audit_checkpoint``, which the worker runs on a schedule.
``verify_chain`` checks the chain against the latest checkpoint.
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

__all__ = ["audit_key"]  # the chain's key, kept with the secrets' (base/secrets.py)

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
    """The chain's end as it was: ``count`` entries up to ``last_id`` (0: none), ``plain`` of them from
    before keyed hashes."""

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
    checked: one that does not match (forged, edited, or signed with another key) refuses the file."""
    target = Path(path)
    if not target.exists():
        return None
    latest = None
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
        latest = checkpoint
    return latest


@dataclass(frozen=True)
class Problem:
    entry: int
    sentence: str

    def __str__(self) -> str:
        return f"entry #{self.entry}: {self.sentence}"


def chain_problems(checkpoint: Checkpoint | None = None) -> list[Problem]:
    """Every entry that does not match, first the lowest id; empty when the chain is intact and,
    given a checkpoint, ends at least where it did then. Reads the log once, in constant memory."""
    key = audit_key()
    problems: list[Problem] = []
    prev, prev_id = GENESIS_HASH, 0
    plain = 0
    keyed_seen = False
    reached = checkpoint is None or checkpoint.last_id == 0
    for count, entry in enumerate(AuditEntry.objects.order_by("id").iterator(chunk_size=2000), start=1):
        if entry.prev_hash != prev:
            problems.append(
                Problem(
                    entry.pk,
                    f"it does not follow #{prev_id or 'the start'}: an entry before it was removed, "
                    "inserted or moved, or this one was",
                )
            )
        if hmac.compare_digest(entry.compute_hash(key), entry.hash):
            keyed_seen = True
        elif entry.compute_hash() == entry.hash:
            # Plain SHA-256: written before keyed hashes, or by someone without the key.
            plain += 1
            if keyed_seen:
                problems.append(
                    Problem(entry.pk, "a plain hash after keyed ones: written or rewritten without the key")
                )
            elif checkpoint is not None and plain > checkpoint.plain:
                problems.append(
                    Problem(
                        entry.pk,
                        f"a plain hash, where the checkpoint of {checkpoint.at} recorded {checkpoint.plain} "
                        "plain-hash entries in all: rewritten without the key",
                    )
                )
        else:
            problems.append(
                Problem(entry.pk, "its content does not match its keyed hash: altered, or not written by us")
            )
        if checkpoint is not None and entry.pk == checkpoint.last_id:
            reached = True
            if entry.hash != checkpoint.last_hash:
                problems.append(
                    Problem(entry.pk, f"its hash is not the one the checkpoint of {checkpoint.at} recorded")
                )
            if count != checkpoint.count:
                problems.append(
                    Problem(
                        entry.pk,
                        f"the checkpoint of {checkpoint.at} counted {checkpoint.count} entries up to it, "
                        f"the log has {count}: entries before it were removed or inserted",
                    )
                )
        if checkpoint is not None and not reached and entry.pk > checkpoint.last_id:
            reached = True
            problems.append(_tail_removed(checkpoint, prev_id))
        prev, prev_id = entry.hash, entry.pk
    if not reached and checkpoint is not None:
        problems.append(_tail_removed(checkpoint, prev_id))
    return sorted(problems, key=lambda p: p.entry)


def _tail_removed(checkpoint: Checkpoint, last_present: int) -> Problem:
    first_missing = last_present + 1
    return Problem(
        first_missing,
        f"missing: the checkpoint of {checkpoint.at} recorded {checkpoint.count} entries up to "
        f"#{checkpoint.last_id}, and the log has none after #{last_present or 'the start'} up to it: "
        "its tail was removed",
    )
