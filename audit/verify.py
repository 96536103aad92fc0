"""Checking the audit log against its key and its latest signed checkpoint: the walks behind ``audit_verify``.

Every entry read must carry the keyed hash (an HMAC with the chain's key) of its content and of the
entry before it. A plain SHA-256 hash, which anyone with the database can recompute, is accepted only
on the log's first entries and only as many of them as a signed checkpoint counted (entries from before
keyed hashes); with no checkpoint, on none.

Two walks, each in constant memory:

- ``verify_since(checkpoint)``, the default: the checkpoint's own entry must still be there, with the
  hash and the count before it the checkpoint recorded, and its keyed hash; then only the entries after
  it are read. On a million entries, seconds (the worker writes a checkpoint every few minutes).
  What it does not read again, the entries up to the checkpoint, it cannot see altered in place.
- ``verify_all(checkpoint)``, ``--full`` (or when there is no checkpoint): every entry from the first,
  reporting its progress; minutes on a million.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db.models import QuerySet

from audit.chain import GENESIS_HASH, Checkpoint, audit_key
from audit.models import AuditEntry

CHUNK = 2000
PROGRESS_EVERY = 100_000
Progress = Callable[[int], None]  # told how many entries were read so far


@dataclass(frozen=True)
class Problem:
    entry: int
    sentence: str

    def __str__(self) -> str:
        return f"entry #{self.entry}: {self.sentence}"


@dataclass
class Verdict:
    """What a walk found, and what it read: ``full`` when it read the log from its first entry."""

    problems: list[Problem]
    read: int
    full: bool
    checkpoint: Checkpoint | None


@dataclass
class _Walk:
    """The entries in id order, each against the one before it, from a known predecessor."""

    key: bytes
    checkpoint: Checkpoint | None  # counts the entries a plain hash is accepted on; None: none
    anchor: Checkpoint | None = None  # checked as its entry goes by (the full walk)
    prev: str = GENESIS_HASH
    prev_id: int = 0
    position: int = 0  # how many entries of the log come before the next one read
    keyed_seen: bool = False
    read: int = 0
    reached: bool = True
    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reached = self.anchor is None or self.anchor.last_id == 0

    def check(self, entry: AuditEntry) -> None:
        self.read += 1
        self.position += 1
        if entry.prev_hash != self.prev:
            self._problem(
                entry,
                f"it does not follow #{self.prev_id or 'the start'}: an entry before it was removed, "
                "inserted or moved, or this one was",
            )
        if hmac.compare_digest(entry.compute_hash(self.key), entry.hash):
            self.keyed_seen = True
        elif entry.compute_hash() == entry.hash:
            self._plain(entry)
        else:
            self._problem(entry, "its content does not match its keyed hash: altered, or not written by us")
        if self.anchor is not None:
            self._anchor(entry)
        self.prev, self.prev_id = entry.hash, entry.pk

    def _plain(self, entry: AuditEntry) -> None:
        """A plain SHA-256 hash: from before keyed hashes, or written by someone without the key."""
        if self.keyed_seen:
            self._problem(entry, "a plain hash after keyed ones: written or rewritten without the key")
        elif self.checkpoint is None:
            self._problem(
                entry,
                "a plain SHA-256 hash, which anyone with the database can recompute, and no signed "
                "checkpoint counts entries from before keyed hashes: rewritten without the key",
            )
        elif self.position > self.checkpoint.plain:
            self._problem(
                entry,
                f"a plain hash, where the checkpoint of {self.checkpoint.at} recorded "
                f"{self.checkpoint.plain} plain-hash entries in all: rewritten without the key",
            )

    def _anchor(self, entry: AuditEntry) -> None:
        anchor = self.anchor
        assert anchor is not None
        if entry.pk == anchor.last_id:
            self.reached = True
            if entry.hash != anchor.last_hash:
                self._problem(entry, f"its hash is not the one the checkpoint of {anchor.at} recorded")
            if self.position != anchor.count:
                self._problem(entry, _miscounted(anchor, self.position))
        elif not self.reached and entry.pk > anchor.last_id:
            self.reached = True
            self.problems.append(_tail_removed(anchor, self.prev_id))

    def finish(self) -> list[Problem]:
        if not self.reached and self.anchor is not None:
            self.problems.append(_tail_removed(self.anchor, self.prev_id))
        return sorted(self.problems, key=lambda p: p.entry)

    def _problem(self, entry: AuditEntry, sentence: str) -> None:
        self.problems.append(Problem(entry.pk, sentence))


def _miscounted(checkpoint: Checkpoint, found: int) -> str:
    return (
        f"the checkpoint of {checkpoint.at} counted {checkpoint.count} entries up to it, the log has "
        f"{found}: entries before it were removed or inserted"
    )


def _tail_removed(checkpoint: Checkpoint, last_present: int) -> Problem:
    return Problem(
        last_present + 1,
        f"missing: the checkpoint of {checkpoint.at} recorded {checkpoint.count} entries up to "
        f"#{checkpoint.last_id}, and the log has none after #{last_present or 'the start'} up to it: "
        "its tail was removed",
    )


def _read(walk: _Walk, entries: QuerySet[AuditEntry], progress: Progress | None, every: int) -> None:
    for entry in entries.order_by("id").iterator(chunk_size=CHUNK):
        walk.check(entry)
        if progress is not None and walk.read % every == 0:
            progress(walk.read)


def verify_all(
    checkpoint: Checkpoint | None = None, *, progress: Progress | None = None, every: int = PROGRESS_EVERY
) -> Verdict:
    """Every entry, from the first, against the key and, given one, the checkpoint: empty problems when
    each is keyed (or a plain one the checkpoint counted) and chained to the one before, and the log ends
    at least where the checkpoint says it did. ``progress`` is told every ``every`` entries read."""
    walk = _Walk(audit_key(), checkpoint, anchor=checkpoint)
    _read(walk, AuditEntry.objects.all(), progress, every)
    return Verdict(walk.finish(), walk.read, full=True, checkpoint=checkpoint)


def verify_since(
    checkpoint: Checkpoint, *, progress: Progress | None = None, every: int = PROGRESS_EVERY
) -> Verdict:
    """The checkpoint's own entry, and the entries after it: it must still be there, keyed, with the hash
    and the count before it that the checkpoint recorded; each after it keyed and chained from it. The
    entries before it are not read (``verify_all`` reads them)."""
    if checkpoint.last_id == 0:  # taken of an empty log: everything is after it
        verdict = verify_all(checkpoint, progress=progress, every=every)
        return Verdict(verdict.problems, verdict.read, full=True, checkpoint=checkpoint)
    key = audit_key()
    problems: list[Problem] = []
    anchor = AuditEntry.objects.filter(pk=checkpoint.last_id).first()
    if anchor is None:
        problems.append(_anchor_missing(checkpoint))
    else:
        problems.extend(_anchor_problems(anchor, checkpoint, key))
    walk = _Walk(
        key,
        checkpoint,
        prev=checkpoint.last_hash,
        prev_id=checkpoint.last_id,
        position=checkpoint.count,
        keyed_seen=checkpoint.count > checkpoint.plain,
    )
    _read(walk, AuditEntry.objects.filter(pk__gt=checkpoint.last_id), progress, every)
    found = sorted(problems + walk.finish(), key=lambda p: p.entry)
    return Verdict(found, walk.read + (anchor is not None), full=False, checkpoint=checkpoint)


def _anchor_problems(anchor: AuditEntry, checkpoint: Checkpoint, key: bytes) -> list[Problem]:
    problems = []
    if anchor.hash != checkpoint.last_hash:
        problems.append(
            Problem(
                anchor.pk,
                f"its hash is not the one the checkpoint of {checkpoint.at} recorded: it, or the log up to "
                "it, was rewritten (audit_verify --full names the first entry that does not match)",
            )
        )
    legacy = checkpoint.count <= checkpoint.plain and anchor.compute_hash() == anchor.hash
    if not (hmac.compare_digest(anchor.compute_hash(key), anchor.hash) or legacy):
        problems.append(
            Problem(anchor.pk, "its content does not match its keyed hash: altered, or not written by us")
        )
    found = AuditEntry.objects.filter(pk__lte=checkpoint.last_id).count()
    if found != checkpoint.count:
        problems.append(
            Problem(anchor.pk, _miscounted(checkpoint, found) + " (audit_verify --full names where)")
        )
    return problems


def _anchor_missing(checkpoint: Checkpoint) -> Problem:
    """The checkpoint's last entry is gone: with every entry after it (its tail removed), or alone."""
    before = (
        AuditEntry.objects.filter(pk__lt=checkpoint.last_id)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    if not AuditEntry.objects.filter(pk__gt=checkpoint.last_id).exists():
        return _tail_removed(checkpoint, before or 0)
    return Problem(
        checkpoint.last_id,
        f"missing: the checkpoint of {checkpoint.at} ended at this entry, and the log no longer holds it: "
        "removed",
    )


def chain_problems(checkpoint: Checkpoint | None = None) -> list[Problem]:
    """Every entry that does not match, the lowest id first (``verify_all``'s problems)."""
    return verify_all(checkpoint).problems
