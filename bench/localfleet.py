"""What the fan-out and scale-out benchmarks share: a scratch database, real node agents on
127.0.0.1 with the stand-in engine, ready replicas recorded in the catalog, and worker and web
processes started as in production."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECRET = "bench-only-secret-key-not-for-any-deployment-0123456789abcdef"
# Replicas from 20000 up: below the kernel's ephemeral range (32768 on Linux), above the agents'.
# BENCH_PORT_BASE moves them, so that two benchmarks on one machine keep apart.
PORT_BASE = int(os.environ.get("BENCH_PORT_BASE", "20000"))


def keep_bytecode() -> None:
    """The benchmark's processes (workers, web servers, agents, engines) keep their bytecode caches
    as a deployment's do, whatever this environment says: with PYTHONDONTWRITEBYTECODE each one
    compiles Django and the rest from source again as it starts (.ci/run unsets it too)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def scratch_database(url: str) -> dict[str, str]:
    """Point Django at ``url`` (dropped and created anew, migrated) and set it up; the
    environment the benchmark's own processes need."""
    env = {
        "DATABASE_URL": url,
        "DJANGO_SECRET_KEY": SECRET,
        "DJANGO_SETTINGS_MODULE": "llmgw_web.settings",
        "LLMGW_REPLICA_PORT_BASE": str(PORT_BASE),
        # The benchmark's agents listen on 127.0.0.1: loopback named beside the private ranges.
        "LLMGW_AGENT_NETWORKS": "private,127.0.0.0/8",
    }
    os.environ.update(env)
    keep_bytecode()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "agent"))  # agent_testing: real agents, as the tests start them
    from bench.pages import _create_database

    _create_database(url, anew=True)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return env


@dataclass
class LocalFleet:
    agents: dict[str, Any]
    nodes: dict[str, Any]
    profiles: dict[str, Any]  # model name: its one profile
    replicas: dict[str, list[Any]] = field(default_factory=dict)  # model name: its replicas

    def launches(self, name: str) -> int:
        """How many times the agents started a process for replica ``name``: each start is an
        attempt with a log of its own, numbered from 1 (``llmgw_agent/attempts.py``; the older
        ones may be pruned, the numbers go on), so the highest number on each agent."""
        from llmgw_agent.attempts import attempts_of

        return sum(
            max((number for number, _ in attempts_of(agent.log_dir, name)), default=0)
            for agent in self.agents.values()
        )


def made_stale(profile: Any, run: int) -> Any:
    """``profile`` with a new revision's worth of change: an argument the launch policy allows
    (a profile's own environment variables are refused unless the policy lists them)."""
    args = list(profile.args)
    if "--max-num-seqs" in args:
        del args[args.index("--max-num-seqs") : args.index("--max-num-seqs") + 2]
    profile.args = [*args, "--max-num-seqs", str(64 + run)]
    return profile


@contextlib.contextmanager
def local_fleet(
    tmp: Path, *, nodes: int, cards: int, models: dict[str, int], load_seconds: float, actor: Any
) -> Iterator[LocalFleet]:
    """``nodes`` agents of ``cards`` cards; each model of ``models`` with a one-card profile of the
    stand-in engine (planned as vLLM, loading in ``load_seconds``) and that many ready replicas, spread over the
    nodes on their first cards, so that as many cards stay free for the replacements."""
    from agent_testing import free_port, running_agent, standin_command

    from base.actor import acting_as
    from catalog.models import Card, Node, Profile
    from catalog.services import catalog as services
    from operations.services.specs import replica_spec
    from tests.support import builders as b

    spec_cards = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559} for i in range(cards)]
    with contextlib.ExitStack() as stack:
        agents = {}
        for i in range(nodes):
            name = f"node-{i:02d}"
            agents[name] = stack.enter_context(
                running_agent(
                    tmp / name,
                    node=name,
                    port=free_port(),
                    cards=spec_cards,
                    engines={"standin": standin_command()},
                    stop_grace_seconds=2,
                    # The agent's default (0.5 s): a replica is probed as soon as its engine writes
                    # to its log besides, so the stand-in's line once loaded is seen at once.
                    ready_poll_seconds=0.5,
                )
            )
        cls = b.gpu_class()
        recorded = {}
        for name, agent in agents.items():
            recorded[name] = Node.objects.create(name=name, agent_url=agent.base_url, agent_token=agent.token)
            Card.objects.bulk_create(Card(node=recorded[name], index=i, gpu_class=cls) for i in range(cards))
        fleet = LocalFleet(agents=agents, nodes=recorded, profiles={})
        placed = []
        k = 0
        for model_name, count in models.items():
            with acting_as(actor):
                profile = services.profile_save(
                    instance=Profile(
                        model=b.llama_8b(model_name),
                        name="h100",
                        engine="standin",
                        gpu_class=cls,
                        gpus_per_node=1,
                        tp=1,
                        env={"STANDIN_LOAD_SECONDS": f"{load_seconds:g}"},
                    )
                )
            fleet.profiles[model_name] = profile
            fleet.replicas[model_name] = []
            for j in range(count):
                node = f"node-{k % nodes:02d}"
                replica = b.replica(
                    profile, recorded[node], [k // nodes], name=f"{model_name}-{j:02d}", port=PORT_BASE + k
                )
                fleet.replicas[model_name].append(replica)
                placed.append((replica, node, k // nodes))
                k += 1

        def start(item: tuple[Any, str, int]) -> None:
            replica, node, card = item
            spec = replica_spec(
                Profile.objects.select_related("model").get(pk=replica.profile_id),
                port=replica.port,
                cards=[card],
            )
            with agents[node].client() as http:
                response = http.put(f"/v1/replicas/{replica.name}", json=spec)
            if response.status_code != 201:
                raise SystemExit(f"{replica.name} did not start on {node}: {response.text}")
            agents[node].wait_for_state(replica.name, "ready", timeout=120)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(start, placed))
        yield fleet


def process(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A process of the app (worker, web server) with the environment of production plus ``env``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    full.update(env)
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def worker(name: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    return process([sys.executable, "manage.py", "db_worker", "--no-reload", "--worker-id", name], env, log)
