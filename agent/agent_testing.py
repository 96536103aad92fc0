"""Run the node agent and the stand-in engine as real processes, for tests.

Standard library only, like the agent: plain functions and context managers,
so that the agent's own tests (``python -m unittest`` from ``agent/``) and the
control plane's (pytest, which puts ``agent/`` on its path) can start a
real agent on 127.0.0.1 and talk to it over HTTP::

    with running_agent(tmp_path) as agent:
        with agent.client() as http:
            http.put("/v1/replicas/r1", json=standin_spec(port=free_port()))
            agent.wait_for_state("r1", "ready")

Every agent started here is stopped on exit, and so is every replica it still
knew about, even when the test failed half-way.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_policy import default_policy, launch_args

AGENT_DIR = Path(__file__).resolve().parent
REPO_ROOT = AGENT_DIR.parent
STANDIN = AGENT_DIR / "standin_engine.py"

# Every engine of the catalog's registry, each played by the stand-in; "standin" is the stand-in under
# its own name, the one engine whose profiles may set its STANDIN_* variables (the launch policy).
ENGINES = ("vllm", "sglang", "trtllm", "llamacpp", "freetoken", "standin")
# How long a stand-in playing another engine loads (the agent's environment, which its engines
# inherit: a real engine's spec may not set STANDIN_ variables).
AGENT_STANDIN_LOAD_SECONDS = "0.3"
H100 = "NVIDIA H100 80GB HBM3"
DEFAULT_CARDS: tuple[Mapping[str, Any], ...] = tuple(
    {"index": i, "name": H100, "memory_mib": 81559} for i in range(4)
)


class TransportError(OSError):
    """Nothing answered: refused, reset, timed out."""


@dataclass
class Answer:
    """An HTTP answer: its status, headers and body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}: {self.text[:500]}")


def request(
    method: str,
    url: str,
    *,
    json_body: Any = None,
    params: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    verify: ssl.SSLContext | None = None,
) -> Answer:
    """One request, straight to the host (never through a proxy from the
    environment); an answer whatever its status, TransportError when nothing answers.

    ``verify`` is the TLS context an https URL is checked with (default: the system's CAs)."""
    parts = urllib.parse.urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if params:
        target += ("&" if parts.query else "?") + urllib.parse.urlencode(params)
    host, port = parts.hostname or "127.0.0.1", parts.port
    connection = (
        http.client.HTTPSConnection(host, port, timeout=timeout, context=verify)
        if parts.scheme == "https"
        else http.client.HTTPConnection(host, port, timeout=timeout)
    )
    data = None if json_body is None else json.dumps(json_body).encode()
    sent = dict(headers or {})
    if data is not None:
        sent["Content-Type"] = "application/json"
    try:
        # A server may answer before reading the whole body (413: too large) and
        # close; its answer is there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.request(method, target, body=data, headers=sent)
        response = connection.getresponse()
        return Answer(response.status, dict(response.headers), response.read())
    except (OSError, http.client.HTTPException) as exc:
        raise TransportError(f"{method} {url}: {exc}") from exc
    finally:
        connection.close()


class Client:
    """Requests to one base URL with fixed headers (a token), in the shape the tests use."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        verify: ssl.SSLContext | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.verify = verify
        self.default_headers = dict(headers or {})
        self.timeout = timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing is kept open between requests: each has its own connection."""

    def request(self, method: str, path: str, **kw: Any) -> Answer:
        headers = {**self.default_headers, **(kw.pop("headers", None) or {})}
        return request(
            method,
            f"{self.base_url}{path}",
            json_body=kw.pop("json", None),
            params=kw.pop("params", None),
            headers=headers,
            timeout=kw.pop("timeout", self.timeout),
            verify=self.verify,
        )

    def get(self, path: str, **kw: Any) -> Answer:
        return self.request("GET", path, **kw)

    def put(self, path: str, **kw: Any) -> Answer:
        return self.request("PUT", path, **kw)

    def post(self, path: str, **kw: Any) -> Answer:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> Answer:
        return self.request("DELETE", path, **kw)


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux; its default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port nothing listens on right now, below the kernel's ephemeral range: a port from
    that range may be taken between this check and the listener's bind by any outgoing
    connection (the tests' own HTTP clients, the worker's), and was, now and then. From 10000 to
    20000: restart_support.port_block keeps the replicas' ports above that."""
    high = min(20000, ephemeral_ports()[0])
    for _ in range(200):
        port = random.randrange(10000, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # nothing free below it: any port
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def standin_command() -> list[str]:
    """The engine command that runs the stand-in with this interpreter."""
    return [sys.executable, str(STANDIN)]


def standin_spec(
    *,
    port: int,
    model: str = "standin-model",
    cards: Iterable[int] = (0,),
    args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    load_seconds: float = 0.3,
    engine: str = "vllm",
    ready_timeout: float = 60,
    launch: bool = True,
    source: str = "org/standin-model",
) -> dict[str, Any]:
    """A PUT /v1/replicas/{id} body for a stand-in that loads in ``load_seconds``.

    ``args`` follow the launcher's own (the launch policy's template for
    ``engine``, as the control plane writes it) unless ``launch`` is False."""
    if launch:
        args = launch_args(
            default_policy(), engine, source=source, port=port, model=model, tp=1, args=list(args)
        )
    return {
        "engine": engine,
        "model": model,
        "args": list(args),
        # The stand-in's own variables only on its own engine: another engine's spec with them is refused.
        "env": {
            **({"STANDIN_LOAD_SECONDS": str(load_seconds)} if engine == "standin" else {}),
            **(env or {}),
        },
        "cards": list(cards),
        "port": port,
        "ready_timeout": ready_timeout,
    }


def wait_until(
    predicate: Any, *, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"
) -> Any:
    """Call ``predicate`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def toml_config(values: Mapping[str, Any]) -> str:
    """A small TOML writer for agent configurations: scalars, arrays of
    scalars, ``cards`` (array of tables) and ``engines`` (table of tables).
    JSON's spelling of strings, numbers, booleans and arrays is valid TOML."""
    lines = [
        f"{key} = {json.dumps(value)}" for key, value in values.items() if key not in ("cards", "engines")
    ]
    for card in values.get("cards", ()):
        lines += ["", "[[cards]]", *(f"{k} = {json.dumps(v)}" for k, v in card.items())]
    for name, engine in values.get("engines", {}).items():
        lines += ["", f"[engines.{json.dumps(name)}]", *(f"{k} = {json.dumps(v)}" for k, v in engine.items())]
    return "\n".join(lines) + "\n"


@dataclass
class RunningAgent:
    base_url: str
    token: str
    node: str
    directory: Path
    config_path: Path
    output_path: Path  # the agent's own stdout and stderr
    log_dir: Path  # replica logs
    process: subprocess.Popen[bytes]
    known_pids: set[int] = field(default_factory=set)
    verify: ssl.SSLContext | None = None  # trusts the CA of an https agent

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token if token is None else token}"}

    def client(self, *, token: str | None = None, timeout: float = 30.0) -> Client:
        """A client of the agent, with the token (or ``token``)."""
        return Client(self.base_url, headers=self.headers(token), timeout=timeout, verify=self.verify)

    def replica(self, replica_id: str) -> dict[str, Any]:
        response = request(
            "GET",
            f"{self.base_url}/v1/replicas/{replica_id}",
            headers=self.headers(),
            timeout=10,
            verify=self.verify,
        )
        response.raise_for_status()
        state = response.json()
        if state.get("pid"):
            self.known_pids.add(state["pid"])
        return state

    def wait_for_state(self, replica_id: str, *states: str, timeout: float = 15.0) -> dict[str, Any]:
        """Poll GET /v1/replicas/{id} until its state is one of ``states``."""
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            nonlocal last
            last = self.replica(replica_id)
            return last if last["state"] in states else None

        try:
            return wait_until(reached, timeout=timeout, what=f"replica {replica_id} to be {'/'.join(states)}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; last seen: {last}") from None

    def output(self) -> str:
        return self.output_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, *, timeout: float = 30.0) -> int:
        """SIGTERM the agent and wait for it; returns its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode

    def kill_known_replicas(self) -> None:
        """SIGKILL the process group of every replica this helper has seen."""
        for pid in self.known_pids:
            if not process_gone(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def agent_config(
    directory: Path,
    *,
    node: str = "gpu-test",
    port: int | None = None,
    cards: Iterable[Mapping[str, Any]] = DEFAULT_CARDS,
    engines: Mapping[str, Iterable[str]] | None = None,
    policy_file: Path | None = None,
    stop_grace_seconds: float = 5,
    ready_poll_seconds: float = 0.1,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The configuration ``running_agent`` writes (without the token)."""
    values: dict[str, Any] = {
        "node": node,
        "listen": f"127.0.0.1:{port or free_port()}",
        "log_dir": str(directory / "logs"),
        "stop_grace_seconds": stop_grace_seconds,
        "ready_poll_seconds": ready_poll_seconds,
    }
    if policy_file is not None:
        values["policy_file"] = str(policy_file)
    values.update(extra or {})
    values["cards"] = [dict(card) for card in cards]
    if engines is None:  # every engine of the catalog's registry, played by the stand-in
        engines = {name: standin_command() for name in ENGINES}
    values["engines"] = {name: {"command": list(command)} for name, command in engines.items()}
    return values


@contextlib.contextmanager
def running_agent(
    directory: Path,
    *,
    token: str | None = None,
    token_in_env: bool = False,
    stop_children_on_exit: bool = True,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 15.0,
    ca_bundle: str | None = None,
    **config: Any,
) -> Iterator[RunningAgent]:
    """Write a configuration into ``directory``, start ``python -m llmgw_agent``
    on it, wait for /healthz, and yield a ``RunningAgent``. On exit the agent
    is stopped, and every replica it reported is killed if still there.

    ``config`` goes to ``agent_config`` (node, port, cards, engines,
    policy_file, stop_grace_seconds, ready_poll_seconds, extra). The
    token goes in a mode-600 file unless ``token_in_env``. Calling it again
    with the same directory and port restarts "the same" agent.
    """
    directory.mkdir(parents=True, exist_ok=True)
    token = token or secrets.token_urlsafe(24)
    values = agent_config(directory, **config)
    process_env = {key: value for key, value in os.environ.items() if not key.startswith("LLMGW_")}
    process_env["PYTHONPATH"] = str(AGENT_DIR)
    process_env.setdefault("STANDIN_LOAD_SECONDS", AGENT_STANDIN_LOAD_SECONDS)
    process_env.update(env or {})
    if token_in_env:
        process_env["LLMGW_AGENT_TOKEN"] = token
    else:
        token_file = directory / "token"
        token_file.write_text(token + "\n", encoding="utf-8")
        token_file.chmod(0o600)
        values["token_file"] = str(token_file)
    config_path = directory / "agent.toml"
    config_path.write_text(toml_config(values), encoding="utf-8")

    output_path = directory / "agent-output.log"
    command = [sys.executable, "-m", "llmgw_agent", "--config", str(config_path)]
    if stop_children_on_exit:
        command.append("--stop-children-on-exit")
    with output_path.open("ab") as output:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=process_env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    tls = "tls_cert_file" in values
    agent = RunningAgent(
        base_url=f"{'https' if tls else 'http'}://{values['listen']}",
        verify=ssl.create_default_context(cafile=ca_bundle) if tls and ca_bundle else None,
        token=token,
        node=values["node"],
        directory=directory,
        config_path=config_path,
        output_path=output_path,
        log_dir=Path(values["log_dir"]),
        process=process,
    )
    try:
        _wait_for_healthz(agent, startup_timeout)
        yield agent
    finally:
        with contextlib.suppress(Exception):
            if process.poll() is None:
                for state in request(
                    "GET",
                    f"{agent.base_url}/v1/replicas",
                    headers=agent.headers(),
                    timeout=5,
                    verify=agent.verify,
                ).json():
                    if state.get("pid"):
                        agent.known_pids.add(state["pid"])
        agent.stop()
        agent.kill_known_replicas()


def _wait_for_healthz(agent: RunningAgent, timeout: float) -> None:
    def healthy() -> bool:
        if agent.process.poll() is not None:
            raise RuntimeError(f"the agent exited with {agent.process.returncode}:\n{agent.output()}")
        try:
            return (
                request("GET", f"{agent.base_url}/healthz", timeout=1, verify=agent.verify).status_code == 200
            )
        except TransportError:
            return False

    try:
        wait_until(healthy, timeout=timeout, what="the agent's /healthz")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; its output:\n{agent.output()}") from None


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


def standin_gpus(directory: Path, cards: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The stand-in nvidia-smi for an agent (standin_nvidia_smi.install): the environment to give it."""
    import standin_nvidia_smi

    return standin_nvidia_smi.install(directory, [dict(c) for c in cards])


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
