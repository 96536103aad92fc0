"""Stand-ins for the tests that need them beside a real agent: the stand-in engine run on its own, an
agent that misbehaves (answers errors, or late), the stand-in nvidia-smi's cards, and a process
the catalog does not know holding memory on them. Standard library only, as agent_testing is."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_testing import TransportError, free_port, request, standin_command, wait_until


@dataclass
class RunningStandin:
    base_url: str
    port: int
    model: str
    process: subprocess.Popen[bytes]
    output_path: Path

    def output(self) -> str:
        return self.output_path.read_text(encoding="utf-8", errors="replace")


@contextlib.contextmanager
def running_standin(
    directory: Path,
    *,
    model: str = "standin-model",
    port: int | None = None,
    args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    load_seconds: float = 0.0,
    wait_ready: bool = True,
) -> Iterator[RunningStandin]:
    """Run the stand-in engine on its own (no agent), e.g. as a gateway backend."""
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    process_env = {**os.environ, "STANDIN_LOAD_SECONDS": str(load_seconds), **(env or {})}
    output_path = directory / f"standin-{port}.log"
    with output_path.open("ab") as output:
        process = subprocess.Popen(
            [*standin_command(), "--port", str(port), "--served-model-name", model, *args],
            env=process_env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    standin = RunningStandin(f"http://127.0.0.1:{port}", port, model, process, output_path)

    def ready() -> bool:
        if process.poll() is not None:
            return True
        try:
            data = request("GET", f"{standin.base_url}/v1/models", timeout=1).json()
        except (TransportError, ValueError):
            return False
        return not wait_ready or any(entry.get("id") == model for entry in data.get("data", []))

    try:
        wait_until(ready, timeout=15, what=f"the stand-in on port {port}")
        yield standin
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


# --- a misbehaving agent -------------------------------------------------------------------------

_FAKE_AGENT = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

status, delay = int(sys.argv[2]), float(sys.argv[3])

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        print(self.command, self.path, flush=True)
        if self.path == "/healthz":
            body, code = {"status": "ok"}, 200
        else:
            time.sleep(delay)
            if status >= 400:
                body, code = {"detail": "Something broke inside the agent.", "code": "internal"}, status
            else:
                body, code = {"state": "starting", "reason": "pretending"}, status
        payload = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PUT = do_DELETE = answer

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@dataclass
class FakeAgent:
    base_url: str
    process: subprocess.Popen[bytes]
    output_path: Path

    def requests(self) -> list[str]:
        """The requests it received, as "METHOD /path" lines."""
        return self.output_path.read_text(encoding="utf-8", errors="replace").splitlines()


@contextlib.contextmanager
def running_fake_agent(directory: Path, *, status: int = 500, delay: float = 0.0) -> Iterator[FakeAgent]:
    """An HTTP server standing where an agent should be, as its own process: every
    /v1 request waits ``delay`` seconds, then answers ``status`` (an error body
    for 4xx/5xx, a replica "starting" otherwise). /healthz answers at once."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    output_path = directory / f"fake-agent-{port}.log"
    with output_path.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-c", _FAKE_AGENT, str(port), str(status), str(delay)],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    fake = FakeAgent(f"http://127.0.0.1:{port}", process, output_path)

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the fake agent exited with {process.returncode}")
        try:
            return request("GET", f"{fake.base_url}/healthz", timeout=1).status_code == 200
        except TransportError:
            return False

    try:
        wait_until(healthy, timeout=15, what="the fake agent")
        yield fake
    finally:
        process.kill()
        process.wait(timeout=10)


def standin_gpus(directory: Path, cards: Iterable[Mapping[str, Any]], **driver: str) -> dict[str, str]:
    """The stand-in nvidia-smi for an agent (standin_nvidia_smi.install; ``driver`` and ``cuda``, the
    versions its ``--version`` prints): the environment to give it."""
    import standin_nvidia_smi

    return standin_nvidia_smi.install(directory, [dict(c) for c in cards], **driver)


@contextlib.contextmanager
def foreign_process(gpu_dir: Path, cards: Iterable[int], used_mib: int) -> Iterator[int]:
    """A process the agent did not start, holding ``used_mib`` on ``cards`` as the stand-in
    nvidia-smi reports it (a sleeping child of this process); its pid while the block runs."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL)
    path = gpu_dir / f"proc-{child.pid}.json"
    path.write_text(
        json.dumps(
            {"pid": child.pid, "cards": list(cards), "used_mib": used_mib, "name": "python3 foreign.py"}
        )
    )
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait(timeout=10)
        path.unlink(missing_ok=True)
