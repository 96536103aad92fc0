"""Each start attempt's log kept, bounded: a replica that crash-loops keeps the log of its first
attempt (where the first error is) and of its latest ones, each cut to its last bytes.

An attempt is one start of a replica id (a PUT that launches a process): its output goes to a
file of its own, ``<log_dir>/<id>.attempt-<n>.log``. When attempt n starts, the attempts kept are
the first and the latest ``keep - 1`` (this one among them); every ended one longer than
``max_bytes`` is cut to its last ``max_bytes``, after a line saying how much was cut. The running
attempt grows while its engine writes (it holds the file open); it is cut once the next one starts.
So a replica's logs hold at most ``keep`` files of ``max_bytes`` each, and the running one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from .spec import AgentError

SUFFIX = ".log"
HEAD_BYTES = 4096  # read to find an attempt's first line (its header: when, cards, port, argv)


def _infix(replica_id: str) -> str:
    return f"{replica_id}.attempt-"


def attempts_of(log_dir: Path, replica_id: str) -> list[tuple[int, Path]]:
    """The attempts kept for the replica, oldest first: (number, file)."""
    prefix = _infix(replica_id)
    found = []
    try:
        names = os.listdir(log_dir)
    except OSError:
        return []
    for name in names:
        if name.startswith(prefix) and name.endswith(SUFFIX):
            number = name[len(prefix) : -len(SUFFIX)]
            if number.isdigit():
                found.append((int(number), log_dir / name))
    return sorted(found)


def kept(log_dir: Path, replica_id: str, attempt: int) -> Path:
    """The log of a kept start attempt; 404 ``not_found`` naming the kept ones when it is not."""
    found = dict(attempts_of(log_dir, replica_id))
    if attempt not in found:
        raise AgentError(
            404,
            "not_found",
            f"No log of attempt {attempt} of replica {replica_id[:140]!r} is kept; the kept ones are "
            f"{', '.join(str(n) for n in found) or 'none'}.",
        )
    return found[attempt]


def cut_to(path: Path, max_bytes: int) -> None:
    """Keep the file's last ``max_bytes`` (from a line's start), after a line saying what was cut."""
    try:
        size = path.stat().st_size
        if size <= max_bytes:
            return
        with path.open("rb") as fh:
            fh.seek(size - max_bytes)
            kept = fh.read()
        newline = kept.find(b"\n")
        if 0 <= newline < len(kept) - 1:
            kept = kept[newline + 1 :]
        note = f"llmgw-agent: the first {size - len(kept)} bytes of this attempt's log were cut\n"
        tmp = path.with_name(path.name + ".cut")
        tmp.write_bytes(note.encode() + kept)
        os.replace(tmp, path)
    except OSError:
        pass  # a log that cannot be cut is left as it is; the next start tries again


def start_attempt(log_dir: Path, replica_id: str, *, keep: int, max_bytes: int) -> Path:
    """The file for the replica's next attempt, the older ones pruned and cut (see the module)."""
    kept = attempts_of(log_dir, replica_id)
    number = kept[-1][0] + 1 if kept else 1
    older = kept[1:] if kept else []
    # Attempt 1 (the first error) stays; of the rest, the latest keep - 2 stay beside the new one.
    doomed = older[: max(0, len(older) - max(0, keep - 2))] if keep >= 2 else kept
    for _, path in doomed:
        with contextlib.suppress(OSError):
            path.unlink()
    for _, path in attempts_of(log_dir, replica_id):
        cut_to(path, max_bytes)
    return log_dir / f"{_infix(replica_id)}{number}{SUFFIX}"


def describe(log_dir: Path, replica_id: str, current: Path | None) -> list[dict[str, Any]]:
    """The attempts kept: number, when it started (its header's first word), size, whether it is
    the replica's current run and whether its start was cut."""
    out = []
    for number, path in attempts_of(log_dir, replica_id):
        try:
            size = path.stat().st_size
            with path.open("rb") as fh:
                first = fh.read(HEAD_BYTES).split(b"\n", 1)[0].decode("utf-8", "replace")
        except OSError:
            continue
        cut = first.startswith("llmgw-agent: the first ")
        out.append(
            {
                "attempt": number,
                "started_at": None if cut else (first.split(" ", 1)[0] or None),
                "bytes": size,
                "current": current is not None and path == current,
                "cut": cut,
            }
        )
    return out


def tail_of(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of an attempt's log (from its last 64 KiB)."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - 64 * 1024)
            fh.seek(start)
            text = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    if start > 0 and text:
        text = text[1:]
    return [line[:2000] for line in text[-lines:]]
