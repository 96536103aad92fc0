"""What the restart and worker tests share: a fleet of real agents recorded in the catalog.

Not collected as tests (no ``test_`` prefix); its fixtures (``fast_restarts``,
``audit_flushable``) are in ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from agent_fakes import standin_gpus
from agent_testing import (
    AGENT_DIR,
    REPO_ROOT,
    STANDIN_RELEASES,
    Agent,
    RunningAgent,
    TransportError,
    agent_in_thread,
    request,
    running_agent,
    standin_command,
    wait_until,
    worker_share,
)
from django.conf import settings
from django.db import connection

from base.actor import Actor, acting_as
from catalog.models import Card, GPUClass, Node, Profile, Replica, ServedModel, Shard
from catalog.services import catalog as services
from operations.models import RestartOperation
from operations.services.specs import replica_spec
from tests.support import builders as b

MODEL = "llama"


def port_block(size: int = 80) -> int:
    """The middle of ``size`` consecutive free ports below Linux's ephemeral range (32768 up), where
    no outgoing connection takes one by chance: old replicas go below it, replacements from it.
    Within this pytest-xdist worker's share of them, so that workers' blocks never overlap."""
    low, high = worker_share(20000, 32700)
    for _ in range(200):
        start = random.randrange(low, high - size)
        try:
            with contextlib.ExitStack() as stack:
                for port in range(start, start + size):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return start + size // 2
    raise RuntimeError("no block of free ports below 32700")


@dataclass
class Fleet:
    agents: dict[str, Agent]
    nodes: dict[str, Node]
    model: ServedModel
    profile: Profile
    replicas: list[Replica] = field(default_factory=list)
    gpu_dirs: dict[str, Path] = field(default_factory=dict)  # each node's stand-in nvidia-smi state

    def agent_of(self, replica: Replica) -> Agent:
        shard = Shard.objects.select_related("card__node").filter(replica=replica).first()
        assert shard is not None, f"{replica.name} holds no cards"
        return self.agents[shard.card.node.name]

    def start(
        self,
        name: str,
        node: str,
        cards: list[int],
        *,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> Replica:
        """A replica of the profile recorded ready, and really started (and ready) on its agent;
        ``env`` is added to its engine's environment there (the stand-in's behaviour, for one replica)."""
        port = port or settings.LLMGW_REPLICA_PORT_BASE - 30 + len(self.replicas)
        replica = b.replica(self.profile, self.nodes[node], cards, name=name, port=port)
        spec = replica_spec(
            Profile.objects.select_related("model").get(pk=self.profile.pk), port=port, cards=cards
        )
        spec["env"] = {**spec["env"], **(env or {})}
        with self.agents[node].client() as http:
            response = http.put(f"/v1/replicas/{name}", json=spec)
            assert response.status_code == 201, response.text
        self.agents[node].wait_for_state(name, "ready")
        self.replicas.append(replica)
        return replica

    def change_profile(self, **fields: Any) -> Profile:
        """Change what the profile runs (audited as a command would): its replicas become stale."""
        profile = Profile.objects.get(pk=self.profile.pk)
        for name, value in fields.items():
            setattr(profile, name, value)
        with acting_as(Actor(via="cli", name="pytest")):
            self.profile = services.profile_save(instance=profile)
        return self.profile

    def ready_on_agents(self) -> dict[str, int]:
        counts = {}
        for name, agent in self.agents.items():
            with agent.client(timeout=5) as http:
                counts[name] = sum(r["state"] == "ready" for r in http.get("/v1/replicas").json())
        return counts


def gpu_class() -> GPUClass:
    return b.gpu_class("h100-80g")


def record_node(name: str, agent_url: str, token: str, cards: int = 4) -> Node:
    node = Node.objects.create(name=name, agent_url=agent_url, agent_token=token)
    Card.objects.bulk_create(Card(node=node, index=i, gpu_class=gpu_class()) for i in range(cards))
    return node


@contextlib.contextmanager
def fleet_of(
    tmp_path: Path,
    nodes: tuple[str, ...] = ("gpu-a", "gpu-b"),
    *,
    cards: int = 4,
    env: dict[str, str] | None = None,
    load_seconds: float = 0.5,
    policy_file: Path | None = None,
    gpus: bool = False,
    processes: bool = False,
) -> Iterator[Fleet]:
    """Real agents, one per node, each with ``cards`` cards and the stand-in engine (``standin``:
    planned as vLLM, and the one engine whose profiles may set its STANDIN_* variables); the
    nodes, a model and its one-card profile of it in the catalog. With ``gpus``, each agent
    reads its cards' telemetry from the stand-in nvidia-smi (``Fleet.gpu_dirs``).

    Each agent's own code serves from a thread of this process (``agent_in_thread``), unless
    ``processes`` (or ``gpus``, whose stand-in nvidia-smi is on the agent's own PATH): then each is
    ``python -m llmgw_agent``, for the end-to-end paths, which kill, hang or restart an agent, or
    run the worker as a process of its own. Their engines are processes either way."""
    card_list = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559} for i in range(cards)]
    gpu_dirs = {name: tmp_path / f"{name}-gpus" for name in nodes} if gpus else {}
    agent_env = {name: standin_gpus(gpu_dirs[name], card_list) for name in gpu_dirs}
    common: dict[str, Any] = {
        "cards": card_list,
        "engines": {"standin": standin_command()},
        "engine_versions": {"standin": STANDIN_RELEASES["standin"]},
        "stop_grace_seconds": 2,
        "ready_poll_seconds": 0.1,
        "policy_file": policy_file,
    }
    with contextlib.ExitStack() as stack:
        agents: dict[str, Agent] = {
            name: stack.enter_context(
                running_agent(tmp_path / name, node=name, env=agent_env.get(name), **common)
                if processes or gpus
                else agent_in_thread(tmp_path / name, node=name, **common)
            )
            for name in nodes
        }
        recorded = {
            name: record_node(name, agent.base_url, agent.token, cards) for name, agent in agents.items()
        }
        model = b.llama_8b(MODEL)
        # Through the service, as in real life: the audit log then knows the profile at each revision.
        with acting_as(Actor(via="cli", name="pytest")):
            profile = services.profile_save(
                instance=Profile(
                    model=model,
                    name="h100",
                    engine="standin",
                    gpu_class=gpu_class(),
                    gpus_per_node=1,
                    tp=1,
                    env={"STANDIN_LOAD_SECONDS": str(load_seconds), **(env or {})},
                )
            )
        yield Fleet(agents=agents, nodes=recorded, model=model, profile=profile, gpu_dirs=gpu_dirs)


@contextlib.contextmanager
def sampling_ready(fleet: Fleet, interval: float = 0.05) -> Iterator[list[int]]:
    """The number of ready replicas on all agents, sampled in a thread while the block runs."""
    samples: list[int] = []
    done = threading.Event()
    clients = [agent.client(timeout=5) for agent in fleet.agents.values()]

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(TransportError):
                samples.append(
                    sum(
                        sum(r["state"] == "ready" for r in http.get("/v1/replicas").json())
                        for http in clients
                    )
                )
            time.sleep(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(timeout=10)
        for http in clients:
            http.close()


def answers(port: int, model: str = MODEL) -> bool:
    """The engine on ``port`` lists ``model`` on /v1/models."""
    try:
        body = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return False
    return any(entry.get("id") == model for entry in body.get("data", []))


def kill_agent(agent: RunningAgent) -> None:
    """SIGKILL the agent process alone, as a crash would: its engines (process groups of their own) run on."""
    if agent.process.poll() is None:
        agent.process.kill()
    agent.process.wait(timeout=10)


def respawn_agent(agent: RunningAgent) -> None:
    """Start the agent again on its configuration (same port, token and records): it adopts the engines
    still running, as after a restart or an upgrade."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LLMGW_")}
    env["PYTHONPATH"] = str(AGENT_DIR)
    command = [
        sys.executable,
        "-m",
        "llmgw_agent",
        "--config",
        str(agent.config_path),
        "--stop-children-on-exit",
    ]
    with agent.output_path.open("ab") as output:
        agent.process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT
        )

    def healthy() -> bool:
        if agent.process.poll() is not None:
            raise RuntimeError(f"the agent exited with {agent.process.returncode}:\n{agent.output()}")
        try:
            return request("GET", f"{agent.base_url}/healthz", timeout=1).status_code == 200
        except TransportError:
            return False

    wait_until(healthy, timeout=30, what=f"agent {agent.node} to answer again")


def engines_on(agent: Agent) -> dict[str, dict[str, Any]]:
    """What the agent runs: its live replicas (starting, loading, ready) by id."""
    with agent.client(timeout=10) as http:
        listed = http.get("/v1/replicas").json()
    for state in listed:
        if state.get("pid"):
            agent.known_pids.add(state["pid"])
    return {r["id"]: r for r in listed if r["state"] in Replica.LIVE_STATES}


def catalog_differences(fleet: Fleet) -> list[str]:
    """Where the catalog and the agents disagree: an engine running that the catalog does not hold (or
    holds on other cards), a replica the catalog holds that no agent runs, a replica ready on one side
    only, a card two engines use. Empty when they agree."""
    found = []
    for name, agent in fleet.agents.items():
        running = engines_on(agent)
        held = {
            r.name: r
            for r in Replica.objects.filter(state__in=Replica.HOLDING_STATES, shards__card__node__name=name)
            .distinct()
            .prefetch_related("shards__card")
        }
        for rid in sorted(set(running) - set(held)):
            found.append(f"{name}: {rid} runs ({running[rid]['state']}) but the catalog does not hold it")
        for rid in sorted(set(held) - set(running)):
            found.append(f"{name}: the catalog holds {rid} ({held[rid].state}) but the agent does not run it")
        for rid in sorted(set(held) & set(running)):
            # A replica across nodes holds cards on each of its ranks' nodes: this node's are compared.
            cards = sorted(
                s.card.index for s in held[rid].shards.all() if s.card.node_id == fleet.nodes[name].pk
            )
            if cards != sorted(running[rid]["cards"]):
                found.append(f"{name}: {rid} runs on cards {running[rid]['cards']}, the catalog says {cards}")
            if (held[rid].state == "ready") != (running[rid]["state"] == "ready"):
                found.append(f"{name}: {rid} is {running[rid]['state']}, the catalog says {held[rid].state}")
        used = [c for r in running.values() for c in r["cards"]]
        if len(used) != len(set(used)):
            found.append(f"{name}: a card is used by two engines: {sorted(used)}")
    return found


def assert_catalog_is_what_agents_run(fleet: Fleet) -> None:
    differences = catalog_differences(fleet)
    assert not differences, differences


def assert_nothing_half_done() -> None:
    """No replica left starting or loading, no card held by a replica that is not live."""
    assert not Replica.objects.filter(state__in=["starting", "loading"]).exists(), list(
        Replica.objects.filter(state__in=["starting", "loading"]).values_list("name", "state")
    )
    held = Shard.objects.exclude(replica__state__in=Replica.LIVE_STATES)
    assert not held.exists(), list(held.values_list("replica__name", "replica__state"))
    assert not RestartOperation.objects.filter(state__in=RestartOperation.ACTIVE_STATES).exists()


# --- a worker process -----------------------------------------------------------------------------

# Short, and allowed: the stale threshold is above the longest agent call (3 + 1 s, and a 4 s stop
# after a 0.5 s drain:
# the test agents' stop grace is 2 s, and the stand-in exits on SIGTERM at once).
WORKER_ENV = {
    "LLMGW_OPERATION_POLL_SECONDS": "0.1",
    "LLMGW_OPERATION_HEARTBEAT_SECONDS": "0.5",
    "LLMGW_OPERATION_STALE_SECONDS": "5",
    "LLMGW_OPERATION_SWEEP_SECONDS": "1",
    "LLMGW_AGENT_TIMEOUT_SECONDS": "3",
    "LLMGW_AGENT_WAIT_SECONDS": "1",
    "LLMGW_AGENT_STOP_SECONDS": "4",
    "LLMGW_STOP_DRAIN_SECONDS": "0.5",
    # An agent away for longer than this fails the step (an agent restarted in 6 s is waited for).
    "LLMGW_AGENT_ABSENT_SECONDS": "12",
    "LLMGW_RESTART_SETTLE_SECONDS": "0.3",
    "LLMGW_RECONCILE_SECONDS": "2",
    # The test agents listen on 127.0.0.1, which the tests' settings name (pyproject.toml's pytest env).
    "LLMGW_AGENT_NETWORKS": "private,127.0.0.0/8",
}


def database_url() -> str:
    """The test database, for another process: PostgreSQL only (see test_worker.py)."""
    s = connection.settings_dict
    host = s.get("HOST") or "127.0.0.1"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{host}:{s.get('PORT') or 5432}/{s['NAME']}"


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def db_worker(
    tmp_path: Path,
    name: str,
    *,
    port_base: int,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Worker]:
    """``manage.py db_worker`` on the test database, as its own process; killed on exit."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LLMGW_")}
    env.update(WORKER_ENV)
    env.update(
        {
            "DATABASE_URL": database_url(),
            "LLMGW_REPLICA_PORT_BASE": str(port_base),
            "DJANGO_SETTINGS_MODULE": "llmgw_web.settings",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra_env or {})
    log = tmp_path / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "db_worker",
                "--no-reload",
                "--interval",
                "0.2",
                "--no-startup-delay",
                "--worker-id",
                name,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Worker(process, log)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def wait_for_operation(
    operation_id: int, *, timeout: float, states: tuple[str, ...] = ()
) -> RestartOperation:
    ended = states or ("succeeded", "failed", "partly_failed", "cancelled")

    def ended_yet() -> RestartOperation | None:
        op = RestartOperation.objects.get(pk=operation_id)
        return op if op.state in ended else None

    return wait_until(
        ended_yet, timeout=timeout, interval=0.2, what=f"restart #{operation_id} to reach {ended}"
    )
