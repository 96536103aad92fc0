"""The agent's state file: its replica table as last saved, written on every change, so that an
agent started again re-adopts the engines still running (``Supervisor.adopt``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .record import Replica
from .spec import AgentError, Spec, parse_spec

log = logging.getLogger("llmgw_agent")


def write(path: Path, node: str, replicas: Iterable[dict[str, Any]]) -> None:
    """The table (each replica's ``Replica.as_state``) written atomically: a crash mid-write
    leaves the previous version. One line, by the C encoder in one write: indented, json.dump
    encodes in Python and writes piece by piece, three times the CPU (a node keeps up to 500
    finished replicas)."""
    tmp = path.with_name(f".{path.name}.tmp")
    text = json.dumps({"node": node, "replicas": list(replicas)}, separators=(",", ":"))
    try:
        # Mode 600: a spec's environment may carry an engine's API key.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        log.error("could not write the state file %s: %s", path, exc)


def read(path: Path, secrets_of: Callable[[Spec], tuple[str, ...]]) -> list[Replica] | None:
    """The replicas the file holds, as saved (their processes not looked at); None without a file,
    and None when it cannot be read, after moving it aside (the agent starts with no replicas)."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["replicas"]
        return [_replica(entry, secrets_of) for entry in entries]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AgentError) as exc:
        aside = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
        with contextlib.suppress(OSError):
            path.rename(aside)
        log.error(
            "state file %s cannot be read (%s); moved it to %s and starting with no replicas",
            path,
            exc,
            aside,
        )
        return None


def _replica(entry: dict, secrets_of: Callable[[Spec], tuple[str, ...]]) -> Replica:
    spec = parse_spec(entry["spec"])
    return Replica(
        id=entry["id"],
        spec=spec,
        secrets=secrets_of(spec),
        state=entry["state"],
        log_path=Path(entry["log_path"]),
        log_offset=int(entry["log_offset"]),
        started_at=entry["started_at"],
        ready_deadline=float(entry["ready_deadline"]),
        pid=entry.get("pid"),
        starttime=entry.get("starttime"),
        ready_at=entry.get("ready_at"),
        finished_at=entry.get("finished_at"),
        exit_code=entry.get("exit_code"),
        reason=entry.get("reason", ""),
    )
