"""The replica record: what the agent knows of one replica, as it answers it and as it saves it."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmgw_policy import redact, redact_lines

from .memory_lines import memory_report
from .process import ProcessHandle, redacted
from .spec import Spec

STARTING, LOADING, READY, FAILED, STOPPED = "starting", "loading", "ready", "failed", "stopped"
LIVE_STATES = frozenset({STARTING, LOADING, READY})
LOG_TAIL_LINES = 20


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(eq=False)
class Replica:
    id: str
    spec: Spec
    state: str
    log_path: Path
    log_offset: int
    started_at: str
    ready_deadline: float  # epoch seconds
    pid: int | None = None
    starttime: int | None = None
    ready_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    reason: str = ""
    adopted: bool = False
    handle: ProcessHandle | None = field(default=None, repr=False)
    stopping: bool = False
    stop_reason: str = ""
    draining: bool = False  # a stop waits for its requests in flight (Supervisor._drain)
    timed_out: bool = False
    killed_after_grace: float | None = None
    done: threading.Event = field(default_factory=threading.Event, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def holds_resources(self) -> bool:
        """Its cards and port are taken: it is live, or its process is still
        being stopped."""
        return self.live or (self.handle is not None and not self.done.is_set())

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "engine": self.spec.engine,
            "model": self.spec.model,
            "cards": list(self.spec.cards),
            "port": self.spec.port,
            "pid": self.pid,
            "state": self.state,
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "finished_at": self.finished_at,
            "exit_code": self.exit_code,
            "log_tail": self.redact_lines(self.log_tail()) if self.state == FAILED else [],
            "reason": self.redact(self.reason),
            "args": redacted(list(self.spec.args)),
            "adopted": self.adopted,
            "draining": self.draining,
            "log_file": str(self.log_path),
            # What the engine printed about its memory at start-up, per card
            # (agent/llmgw_agent/memory_lines.py), and what nvidia-smi says it holds.
            "memory": memory_report(
                self.log_path,
                self.log_offset,
                self.pid,
                len(self.spec.cards),
                self.spec.engine,
                self.spec.args,
            )
            if self.live
            else {},
            # One rank of a replica across nodes, as the spec gave it; absent on a one-node replica.
            **({"group": self.spec.group.as_dict()} if self.spec.group is not None else {}),
        }

    def redact(self, text: str) -> str:
        """``text`` without the values of the spec's secret variables (API keys), nor their encoded
        or split copies (``llmgw_policy.redact``)."""
        return redact(text, self.secrets)

    def redact_lines(self, lines: list[str]) -> list[str]:
        """Log lines redacted together: a secret split across two of them is caught too."""
        return redact_lines(lines, self.secrets)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        """The last ``lines`` lines this run wrote to its log."""
        try:
            with self.log_path.open("rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                start = max(self.log_offset, size - 64 * 1024)
                fh.seek(start)
                chunk = fh.read()
        except OSError:
            return []
        text = chunk.decode("utf-8", "replace")
        tail = text.splitlines()
        if start > self.log_offset and tail:
            tail = tail[1:]  # the first line was cut in the middle
        return [line[:2000] for line in tail[-lines:]]

    def as_state(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "spec": self.spec.as_dict(),
            "state": self.state,
            "log_path": str(self.log_path),
            "log_offset": self.log_offset,
            "started_at": self.started_at,
            "ready_deadline": self.ready_deadline,
            "pid": self.pid,
            "starttime": self.starttime,
            "ready_at": self.ready_at,
            "finished_at": self.finished_at,
            "exit_code": self.exit_code,
            "reason": self.reason,
        }
