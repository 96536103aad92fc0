"""Engine processes: the ones this agent started, the ones it adopted, and their process groups.

Engines run in their own session, so a replica's process group is its
engine's pid. An adopted process (started by an earlier run of the agent) is
told apart from a reused pid by its start time in /proc.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from typing import Protocol


def port_free(port: int) -> bool:
    """Whether an engine could listen on ``port`` on every address of this host.

    Another program holding it would make the engine fail to bind after it
    had loaded for nothing; asked first, the control plane picks another.
    SO_REUSEADDR, as servers set it, so a port left in TIME_WAIT counts free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class ProcessHandle(Protocol):
    pid: int

    def exited(self) -> bool: ...

    def exit_code(self) -> int | None: ...

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True once the process is gone."""
        ...


class ChildProcess:
    """A process this agent started: it can be waited for and has an exit code."""

    def __init__(self, popen: subprocess.Popen[bytes]):
        self.popen = popen
        self.pid = popen.pid

    def exited(self) -> bool:
        return self.popen.poll() is not None

    def exit_code(self) -> int | None:
        return self.popen.returncode

    def wait(self, timeout: float) -> bool:
        try:
            self.popen.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            return False
        return True


class AdoptedProcess:
    """An engine started by an earlier run of the agent. It is not our child,
    so its exit code is unknown; it is gone when its pid no longer names a
    live process with the start time recorded when it was started."""

    def __init__(self, pid: int, starttime: int):
        self.pid = pid
        self.starttime = starttime

    def exited(self) -> bool:
        stat = proc_stat(self.pid)
        return stat is None or stat[1] != self.starttime or stat[0] in "ZX"

    def exit_code(self) -> int | None:
        return None

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.exited():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.05, left))
        return True


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of ``pid`` from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


_SECRET_FLAG = re.compile(r"^--?[\w-]*(key|token|secret|password)[\w-]*$", re.IGNORECASE)


def redacted(argv: list[str]) -> list[str]:
    """``argv`` for a log line: the value of any flag named like a secret
    (``--api-key KEY``, ``--hf-token=...``) replaced by ``***``."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        name, eq, _ = token.partition("=")
        if hide_next and not token.startswith("-"):
            out.append("***")
        elif _SECRET_FLAG.match(name) and eq:
            out.append(f"{name}=***")
        else:
            out.append(token)
        hide_next = bool(_SECRET_FLAG.match(token))
    return out


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exit code {code}"
