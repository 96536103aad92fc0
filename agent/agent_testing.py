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

``agent_in_thread`` runs the same agent (its configuration, supervisor and HTTP
server: the code ``python -m llmgw_agent`` runs) in a thread of the calling
process instead, for tests of what talks to an agent rather than of the agent
program; its engines are processes all the same.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_http import Client, TransportError, request
from llmgw_agent.cards import discover_cards
from llmgw_agent.config import load_config
from llmgw_agent.server import AgentServer
from llmgw_agent.supervisor import Supervisor
from llmgw_policy import GroupSpec, default_policy, launch_args, load_policy

AGENT_DIR = Path(__file__).resolve().parent
REPO_ROOT = AGENT_DIR.parent
STANDIN = AGENT_DIR / "standin_engine.py"

# Every engine of the catalog's registry, each played by the stand-in; "standin" is the stand-in under
# its own name, the one engine whose profiles may set its STANDIN_* variables (the launch policy).
ENGINES = ("vllm", "sglang", "trtllm", "llamacpp", "freetoken", "standin")
# The releases a test agent declares its stand-in engines to be (config: [engines.NAME] version), so
# that it reports installed engines without a real one to read (llmgw_agent/facts.py).
STANDIN_RELEASES = {
    "vllm": "0.19.1",
    "sglang": "0.5.10",
    "trtllm": "1.0.0",
    "llamacpp": "b6500",
    "freetoken": "0.2.1",
    "standin": "0.19.1",
}
# How long a stand-in playing another engine loads (the agent's environment, which its engines
# inherit: a real engine's spec may not set STANDIN_ variables).
AGENT_STANDIN_LOAD_SECONDS = "0.3"
H100 = "NVIDIA H100 80GB HBM3"
DEFAULT_CARDS: tuple[Mapping[str, Any], ...] = tuple(
    {"index": i, "name": H100, "memory_mib": 81559} for i in range(4)
)


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux; its default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def worker_share(low: int, high: int) -> tuple[int, int]:
    """This pytest-xdist worker's own slice of the ports ``low`` to ``high`` (its
    PYTEST_XDIST_WORKER "gwN" of PYTEST_XDIST_WORKER_COUNT), so that tests running at once in
    other workers never pick a port between its check and its bind; all of them otherwise."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return low, high
    share = (high - low) // int(count)
    start = low + (int(worker[2:]) % int(count)) * share
    return start, start + share


def free_port() -> int:
    """A TCP port nothing listens on right now, below the kernel's ephemeral range: a port from
    that range may be taken between this check and the listener's bind by any outgoing
    connection (the tests' own HTTP clients, the worker's), and was, now and then. From 10000 to
    20000 (this pytest-xdist worker's share of them): tests/support/restart.port_block keeps the
    replicas' ports above that."""
    low, high = worker_share(10000, min(20000, ephemeral_ports()[0]))
    for _ in range(200):
        port = random.randrange(low, high)
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
    group: GroupSpec | None = None,
) -> dict[str, Any]:
    """A PUT /v1/replicas/{id} body for a stand-in that loads in ``load_seconds``.

    ``args`` follow the launcher's own (the launch policy's template for
    ``engine``, as the control plane writes it, with the rank flags of
    ``group``, one rank of a replica across nodes) unless ``launch`` is False."""
    cards = list(cards)
    if launch:
        args = launch_args(
            default_policy(),
            engine,
            source=source,
            port=port,
            model=model,
            tp=len(cards) if group is not None else 1,
            args=list(args),
            group=group,
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
        **({"group": group.as_dict()} if group is not None else {}),
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


@dataclass(kw_only=True)
class Agent:
    """An agent on 127.0.0.1, however it runs: what a test asks of it."""

    base_url: str
    token: str
    node: str
    directory: Path
    config_path: Path
    output_path: Path  # the agent's own log
    log_dir: Path  # replica logs
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
        """Stop the agent, and the replicas it runs, as SIGTERM does; returns its exit code."""
        raise NotImplementedError

    def remember_replicas(self) -> None:
        """Note the pid of every replica the agent reports, for ``kill_known_replicas``."""
        with contextlib.suppress(Exception):
            for state in request(
                "GET", f"{self.base_url}/v1/replicas", headers=self.headers(), timeout=5, verify=self.verify
            ).json():
                if state.get("pid"):
                    self.known_pids.add(state["pid"])

    def kill_known_replicas(self) -> None:
        """SIGKILL the process group of every replica this helper has seen."""
        for pid in self.known_pids:
            if not process_gone(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


@dataclass(kw_only=True)
class RunningAgent(Agent):
    """``python -m llmgw_agent`` as a process of its own."""

    process: subprocess.Popen[bytes]

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


@dataclass(kw_only=True)
class AgentInThread(Agent):
    """The agent's server and supervisor serving from a thread of this process."""

    server: AgentServer
    supervisor: Supervisor
    thread: threading.Thread

    def stop(self, *, timeout: float = 30.0) -> int:
        """What the agent does on SIGTERM with --stop-children-on-exit: stop serving, stop every
        replica, close the port."""
        if self.thread.is_alive():
            self.server.shutdown()
            self.thread.join(timeout)
            self.supervisor.shutdown(stop_children=True)
            self.server.server_close()
        return 0


def agent_config(
    directory: Path,
    *,
    node: str = "gpu-test",
    port: int | None = None,
    cards: Iterable[Mapping[str, Any]] = DEFAULT_CARDS,
    engines: Mapping[str, Iterable[str]] | None = None,
    engine_versions: Mapping[str, str] | None = None,
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
        engine_versions = STANDIN_RELEASES if engine_versions is None else engine_versions
    versions = engine_versions or {}
    values["engines"] = {
        name: {"command": list(command), **({"version": versions[name]} if name in versions else {})}
        for name, command in engines.items()
    }
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
        if process.poll() is None:
            agent.remember_replicas()
        agent.stop()
        agent.kill_known_replicas()


@contextlib.contextmanager
def agent_in_thread(directory: Path, *, token: str | None = None, **config: Any) -> Iterator[AgentInThread]:
    """``running_agent`` without the process: the configuration written and read as the agent
    reads it, its supervisor and HTTP server made as ``python -m llmgw_agent`` makes them, serving
    from a thread of this process until the block ends; then stopped as on SIGTERM with
    ``--stop-children-on-exit``, and every replica it reported killed if still there.

    The agent's own code over HTTP on 127.0.0.1, a third of a second sooner than a process and
    without one: for tests of what talks to an agent. Its engines are processes, started by its
    supervisor with this process's environment (less ``LLMGW_*``, as the agent strips them); the
    configuration is read without the environment's overrides, as a process started by
    ``running_agent`` is given none. What tests the agent program itself (its environment, PATH,
    signals, TLS, restarts) uses ``running_agent``. Its log lines go to ``output_path``, with those
    of any other agent in this process (they share the "llmgw_agent" logger)."""
    directory.mkdir(parents=True, exist_ok=True)
    token = token or secrets.token_urlsafe(24)
    values = agent_config(directory, **config)
    if "tls_cert_file" in values:
        raise ValueError("an agent with TLS is tested as a process: use running_agent")
    token_file = directory / "token"
    token_file.write_text(token + "\n", encoding="utf-8")
    token_file.chmod(0o600)
    values["token_file"] = str(token_file)
    config_path = directory / "agent.toml"
    config_path.write_text(toml_config(values), encoding="utf-8")
    loaded = load_config(config_path, environ={})
    policy = load_policy(loaded.policy_file) if loaded.policy_file else default_policy()
    cards, cards_source = discover_cards(loaded.cards)
    supervisor = Supervisor(loaded, cards, policy=policy)
    server = AgentServer(loaded, supervisor, cards_source)
    supervisor.adopt()
    output_path = directory / "agent-output.log"
    with contextlib.ExitStack() as stack:
        stack.enter_context(_agent_log_to(output_path))
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"agent-{loaded.node}",
            daemon=True,
        )
        thread.start()
        agent = AgentInThread(
            base_url=f"http://{values['listen']}",
            token=token,
            node=loaded.node,
            directory=directory,
            config_path=config_path,
            output_path=output_path,
            log_dir=loaded.log_dir,
            server=server,
            supervisor=supervisor,
            thread=thread,
        )
        try:
            yield agent
        finally:
            if thread.is_alive():
                agent.remember_replicas()
            agent.stop()
            agent.kill_known_replicas()


@contextlib.contextmanager
def _agent_log_to(path: Path) -> Iterator[None]:
    """The "llmgw_agent" logger's lines, from INFO up as the agent program logs them, into ``path``."""
    logger = logging.getLogger("llmgw_agent")
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s")
    )
    level = logger.level
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


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
