"""Engine processes: the ones this agent started, the ones it adopted, and their process groups.

Engines run in their own session, so a replica's process group is its
engine's pid. An adopted process (started by an earlier run of the agent) is
told apart from a reused pid by its start time in /proc.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import threading
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


class ExitSignal:
    """A process's pidfd (Linux 5.3 and later, ``os.pidfd_open``): it becomes readable when the
    process ends, so a wait is one poll(2) that sleeps until then. Without it a wait polls:
    ``Popen.wait(timeout)`` calls waitpid every 1 to 50 ms, some 15 wake-ups a replica for
    every poll of the agent's watcher, for as long as the replica lives.

    ``gone`` is None when the kernel or platform has no pidfd (or the process was not there to
    open one for), and the caller polls as before. The descriptor is closed once the process
    is known gone and no thread is still waiting on it (a closed number can be given to the
    next file opened, and a wait on it would watch that file instead)."""

    def __init__(self, pid: int):
        self._lock = threading.Lock()
        self._waiting = 0
        self._ended = False
        self._fd: int | None = None
        opener = getattr(os, "pidfd_open", None)
        if opener is not None:
            with contextlib.suppress(OSError):
                self._fd = opener(pid)

    def gone(self, timeout: float) -> bool | None:
        """Whether the process ends within ``timeout`` seconds; None: this cannot tell."""
        with self._lock:
            if self._fd is None:
                return True if self._ended else None
            fd = self._fd
            self._waiting += 1
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(max(timeout, 0) * 1000))
        finally:
            with self._lock:
                self._waiting -= 1
                self._close_if_done()

    def ended(self) -> None:
        """The process is gone (reaped, or seen gone): the descriptor is closed when nobody waits."""
        with self._lock:
            self._ended = True
            self._close_if_done()

    def _close_if_done(self) -> None:
        if self._ended and self._waiting == 0 and self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ChildProcess:
    """A process this agent started: it can be waited for and has an exit code."""

    def __init__(self, popen: subprocess.Popen[bytes]):
        self.popen = popen
        self.pid = popen.pid
        # Opened before anything reaps the child, so the pid is still this process's.
        self._exit = ExitSignal(popen.pid)

    def exited(self) -> bool:
        if self.popen.poll() is None:
            return False
        self._exit.ended()
        return True

    def exit_code(self) -> int | None:
        return self.popen.returncode

    def wait(self, timeout: float) -> bool:
        gone = self._exit.gone(timeout)
        if gone is False:
            return False
        try:
            # Ended: reaps it at once. No pidfd: waits as Popen does.
            self.popen.wait(timeout=max(timeout, 0) if gone is None else None)
        except subprocess.TimeoutExpired:
            return False
        self._exit.ended()
        return True


class AdoptedProcess:
    """An engine started by an earlier run of the agent. It is not our child,
    so its exit code is unknown; it is gone when its pid no longer names a
    live process with the start time recorded when it was started."""

    def __init__(self, pid: int, starttime: int):
        self.pid = pid
        self.starttime = starttime
        self._exit = ExitSignal(pid)
        # The pid may have been reused between the start time's check and the pidfd's opening:
        # checked again now that the pidfd holds whichever process it names.
        if self.exited():
            self._exit.ended()

    def exited(self) -> bool:
        stat = proc_stat(self.pid)
        gone = stat is None or stat[1] != self.starttime or stat[0] in "ZX"
        if gone:
            self._exit.ended()
        return gone

    def exit_code(self) -> int | None:
        return None

    def wait(self, timeout: float) -> bool:
        gone = self._exit.gone(timeout)
        if gone is not None:
            return gone or self.exited()
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
