"""``python manage.py demo``: the whole system on one machine, for ``make run``.

Starts one node agent per node of the catalog whose agent URL is on this
machine (the stand-in engine in place of every engine of the registry, the
node's cards from the catalog), starts the replicas the catalog says are
running on those agents, then the worker (``db_worker``) and the web server,
and sweeps for abandoned restarts while they run. Ctrl-C stops them all:
the web server and the worker first, then the agents, which stop their
replicas.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import standin_nvidia_smi  # agent/, on the path (llmgw_web/__init__.py)
from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from agentclient.client import AgentCallFailed, AgentClient
from base.commands import ActorCommand
from catalog.models import Node, Profile, Replica, ServedModel, Shard
from catalog.services import catalog as services
from catalog.services.fit import planned_with_release, profile_memory
from demo import fleet
from demo.management.commands.demo_foreign_process import stop_foreign_processes
from operations.services.placement import replica_placement
from operations.services.specs import running_ranks, running_spec
from operations.tasks import operations_sweep
from planning import engines

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
AGENT_DIR = Path(settings.BASE_DIR) / "agent"
STANDIN = AGENT_DIR / "standin_engine.py"
READY_WAIT_SECONDS = 60.0


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


def _toml_value(value: Any) -> str:
    return json.dumps(value)  # JSON's strings, numbers, booleans and arrays are valid TOML


def agent_config(node: Node, directory: Path) -> str:
    """The agent configuration (TOML) for ``node``: its cards from the catalog, the stand-in for every engine."""
    url = urlsplit(node.agent_url)
    token_file = directory / "token"
    token_file.write_text(node.agent_token + "\n", encoding="utf-8")
    token_file.chmod(0o600)
    lines = [
        f"node = {_toml_value(node.name)}",
        f"listen = {_toml_value(f'{url.hostname}:{url.port or 80}')}",
        f"token_file = {_toml_value(str(token_file))}",
        f"log_dir = {_toml_value(str(directory / 'logs'))}",
        # The agent enforces the launch policy it carries, the same file as the control plane's.
        f"model_roots = [{', '.join(_toml_value(root) for root in settings.LLMGW_MODEL_ROOTS)}]",
        "stop_grace_seconds = 3",
        "ready_poll_seconds = 0.5",
        "stop_children_on_exit = true",
    ]
    for card in node.cards.select_related("gpu_class").order_by("index"):
        lines += [
            "",
            "[[cards]]",
            f"index = {card.index}",
            f"name = {_toml_value(card.gpu_class.name)}",
            f"memory_mib = {card.gpu_class.memory_mib}",
        ]
    for name in sorted(engines.registry()):
        lines += [
            "",
            f"[engines.{_toml_value(name)}]",
            # The stand-in plays the engine: its start-up memory lines and the memory it holds.
            f"command = {_toml_value([sys.executable, str(STANDIN), '--play', name])}",
            *([f"version = {_toml_value(fleet.RELEASES[name])}"] if name in fleet.RELEASES else []),
        ]
    return "\n".join(lines) + "\n"


def demo_metrics_token(root: Path) -> str:
    """The demo's token for ``/metrics``: made once, kept in ``root/metrics-token`` (mode 0600) so a
    Prometheus set up against one ``make run`` still scrapes the next."""
    path = root / "metrics-token"
    if path.is_file():
        token = path.read_text(encoding="utf-8").strip()
        if len(token) >= 32:
            return token
    token = secrets.token_urlsafe(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    return token


def write_standin_models(directory: Path) -> None:
    """What the stand-in engines know of the catalog's models (``models.json`` beside the stand-in
    nvidia-smi's cards, by source): their sizes, so that the start-up lines and held memory they
    play follow each engine's accounting (agent/standin_memory.py)."""
    from catalog.selectors import shape_of

    models = {}
    for model in ServedModel.objects.order_by("name"):
        shape = shape_of(model)
        if shape.weight_bytes is None:
            continue
        models[model.source] = {
            "weight_bytes": shape.weight_bytes,
            "expert_bytes": shape.expert_bytes or 0,
            "kv_bytes_per_token": shape.kv_bytes_per_token or 0,
            "kv_heads": shape.kv_heads or 0,
            "hidden_size": shape.hidden_size or 0,
            "intermediate_size": shape.intermediate_size or 0,
            "vocab_size": shape.vocab_size or 0,
            "layers": shape.layers or 0,
            "context_length": model.context_length or 0,
        }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "models.json").write_text(json.dumps(models, indent=1), encoding="utf-8")


def record_memory(replica: Replica, report: dict[str, Any]) -> None:
    """Keep what the replica's cards were planned to hold beside what its engine said it took and
    nvidia-smi shows (the agent's report), as the restart worker does for a replica it starts."""
    profile = Profile.objects.select_related("model", "gpu_class").get(pk=replica.profile_id)
    replica.planned_memory = planned_with_release(profile, profile_memory(profile, profile.model))
    replica.measured_memory = report
    replica.measured_at = timezone.now() if report else None
    services.replica_save(instance=replica, message="demo: its memory at start-up, planned and measured")


def port_clashes() -> list[tuple[Replica, int]]:
    """Live replicas that share a port with another on the same host (nodes
    whose agents share a machine, as the demo's do), each with a free port."""
    seen: dict[str, set[int]] = defaultdict(set)
    taken: dict[str, set[int]] = defaultdict(set)
    rows = []
    for replica in Replica.objects.filter(state__in=Replica.LIVE_STATES).order_by("name"):
        node, _ = replica_placement(replica)
        if node is not None:
            rows.append((replica, node.agent_host))
            taken[node.agent_host].add(replica.port)
    moves = []
    for replica, host in rows:
        if replica.port in seen[host]:
            port = max(taken[host] | {settings.LLMGW_REPLICA_PORT_BASE - 1}) + 1
            taken[host].add(port)
            moves.append((replica, port))
        else:
            seen[host].add(replica.port)
    return moves


class Command(ActorCommand):
    help = (
        "Run the demo on this machine: a node agent per local node (stand-in engines), the catalog's running "
        "replicas started on them, the worker and the web server. Ctrl-C stops everything."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--addr", default="127.0.0.1:8000", help="where the web server listens")
        parser.add_argument("--reload", action="store_true", help="let the web server reload on code changes")

    def act(self, *args: Any, **options: Any) -> None:
        self.children: list[Child] = []
        self.stopping = False
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll would drown what matters
        root = Path(settings.VAR_DIR) / "demo"
        root.mkdir(parents=True, exist_ok=True)
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            self._run(root, options)
        except KeyboardInterrupt:
            pass
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stopping:
            return
        self.stopping = True
        raise KeyboardInterrupt

    # -- the parts -----------------------------------------------------------------------------

    def _spawn(self, name: str, command: list[str], log: Path, env: dict[str, str] | None = None) -> Child:
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                cwd=settings.BASE_DIR,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches this launcher only; it stops the others in order
            )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def _run(self, root: Path, options: dict[str, Any]) -> None:
        nodes = [n for n in Node.objects.order_by("name") if n.agent_host in LOCAL_HOSTS]
        skipped = Node.objects.exclude(pk__in=[n.pk for n in nodes]).values_list("name", flat=True)
        if not nodes:
            raise CommandError(
                "No node of the catalog has its agent on this machine (127.0.0.1): load the demo "
                "fleet first (python manage.py seed_demo)."
            )
        for node in nodes:
            directory = root / node.name
            directory.mkdir(parents=True, exist_ok=True)
            config = directory / "agent.toml"
            config.write_text(agent_config(node, directory), encoding="utf-8")
            # No GPU here: the agent reads its cards' telemetry from the stand-in nvidia-smi, where
            # each stand-in engine registers the memory it holds (agent/standin_nvidia_smi.py).
            cards = [
                {"index": c.index, "name": c.gpu_class.name, "memory_mib": c.gpu_class.memory_mib}
                for c in node.cards.select_related("gpu_class").order_by("index")
            ]
            write_standin_models(directory / "gpus")
            self._spawn(
                f"agent {node.name}",
                [sys.executable, "-m", "llmgw_agent", "--config", str(config)],
                directory / "agent.log",
                env={"PYTHONPATH": str(AGENT_DIR), **standin_nvidia_smi.install(directory / "gpus", cards)},
            )
        for node in nodes:
            self._wait_healthy(node)
        self.stdout.write(
            f"agents: {', '.join(f'{n.name} at {n.agent_url}' for n in nodes)}"
            + (f" (not on this machine, not started: {', '.join(skipped)})" if skipped else "")
        )

        for replica, port in port_clashes():
            old = replica.port
            replica.port = port
            services.replica_save(
                instance=replica,
                message=f"demo: port {old} is taken by another replica on the same machine; moved to {port}",
            )
        self._start_replicas(nodes)

        self._spawn(
            "worker",
            [sys.executable, "manage.py", "db_worker", "--no-reload", "--interval", "1"],
            root / "worker.log",
            env={"LLMGW_TELEMETRY_SECONDS": "5"},  # its cards' telemetry, for the nodes grid
        )
        web = [sys.executable, "manage.py", "runserver", options["addr"]]
        if not options["reload"]:
            web.append("--noreload")
        metrics_token = settings.LLMGW_METRICS_TOKEN or demo_metrics_token(root)
        self._spawn("web", web, root / "web.log", env={"LLMGW_METRICS_TOKEN": metrics_token})
        self.stdout.write(f"worker: python manage.py db_worker (log {root / 'worker.log'})")
        self.stdout.write(f"web: http://{options['addr']}/ (log {root / 'web.log'}); API docs at /api/docs/")
        self.stdout.write(
            f"metrics: curl -H 'Authorization: Bearer {metrics_token}' http://{options['addr']}/metrics"
        )
        self.stdout.write(
            "a process the catalog does not know on a card: "
            "python manage.py demo_foreign_process gpu-h1 --card 5 (--stop ends it)"
        )
        self.stdout.write("Ctrl-C stops the web server, the worker, the agents and their replicas.")

        while True:
            for child in self.children:
                if child.process.poll() is not None:
                    raise CommandError(
                        f"{child.name} exited with {child.process.returncode}; see {child.log}."
                    )
            for operation_id in operations_sweep():
                self.stdout.write(f"restart #{operation_id}: its worker is gone; a new run is enqueued")
            time.sleep(min(settings.LLMGW_OPERATION_SWEEP_SECONDS, 5))

    def _wait_healthy(self, node: Node) -> None:
        deadline = time.monotonic() + 15
        child = next(c for c in self.children if c.name == f"agent {node.name}")
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                raise CommandError(
                    f"The agent of {node.name} exited with {child.process.returncode}: "
                    f"{child.log.read_text(errors='replace')[-800:]}"
                )
            try:
                if (
                    httpx.get(f"{node.agent_url.rstrip('/')}/healthz", timeout=1, trust_env=False).status_code
                    == 200
                ):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise CommandError(
            f"The agent of {node.name} did not answer on {node.agent_url} within 15 s; see {child.log}."
        )

    def _start_replicas(self, nodes: list[Node]) -> None:
        """PUT every replica the catalog says runs on these nodes; wait until they are ready."""
        started: list[tuple[Replica, Node]] = []
        groups: list[tuple[Replica, list[tuple[Node, dict[str, Any]]]]] = []
        for replica in Replica.objects.filter(state__in=Replica.LIVE_STATES).order_by("name"):
            node, cards = replica_placement(replica)
            if node is None or node.pk not in {n.pk for n in nodes}:
                continue
            if Shard.objects.filter(replica=replica, rank__gt=0).exists():
                ranks = self._start_group(replica, nodes)
                if ranks:
                    groups.append((replica, ranks))
                continue
            spec = running_spec(replica, node_cards=cards, ready_timeout=READY_WAIT_SECONDS)
            if spec is None:
                self._failed(replica, "the spec it runs is not known")
                continue
            try:
                AgentClient.for_node(node).start(replica.name, spec)
            except AgentCallFailed as exc:
                self._failed(replica, exc.message)
                continue
            started.append((replica, node))
        deadline = time.monotonic() + READY_WAIT_SECONDS
        waiting = list(started)
        while (waiting or groups) and time.monotonic() < deadline:
            time.sleep(0.5)
            for group in list(groups):
                if self._group_settled(*group):
                    groups.remove(group)
            for replica, node in list(waiting):
                try:
                    state = AgentClient.for_node(node).get(replica.name)
                except AgentCallFailed:
                    continue
                if state["state"] == "ready":
                    waiting.remove((replica, node))
                    record_memory(replica, state.get("memory") or {})
                elif state["state"] in ("failed", "stopped"):
                    waiting.remove((replica, node))
                    self._failed(replica, state.get("reason") or state["state"])
        ready = len(started) - len(waiting)
        self.stdout.write(
            f"replicas: {ready} of {len(started)} started and ready"
            + (f"; still loading: {', '.join(r.name for r, _ in waiting)}" if waiting else "")
            + (f"; groups not ready yet: {', '.join(r.name for r, _ in groups)}" if groups else "")
        )

    def _start_group(self, replica: Replica, nodes: list[Node]) -> list[tuple[Node, dict[str, Any]]]:
        """PUT every rank of a replica across nodes to its node's agent, rank 0 first (the specs name
        rank 0's address and the rendezvous port); the ranks started, [] when one could not be."""
        local = {n.name: n for n in nodes}
        ranks = running_ranks(replica, ready_timeout=READY_WAIT_SECONDS)
        if any(r["node"] not in local for r in ranks):
            self._failed(replica, "one of its ranks' nodes has no agent on this machine")
            return []
        if any(r["spec"] is None for r in ranks):
            self._failed(replica, "the specs its ranks run are not known")
            return []
        started = []
        for rank in ranks:
            node = local[rank["node"]]
            try:
                started.append((node, AgentClient.for_node(node).start(replica.name, rank["spec"])))
            except AgentCallFailed as exc:
                for other, _ in started:
                    AgentClient.for_node(other).stop(replica.name, drain=0)
                self._failed(replica, f"rank {rank['rank']} on {node.name}: {exc.message}")
                return []
        return started

    def _group_settled(self, replica: Replica, ranks: list[tuple[Node, dict[str, Any]]]) -> bool:
        """Whether the group is ready (rank 0 serving, every rank alive: its memory recorded) or
        failed (a rank lost takes it down: every rank stopped); False while it starts."""
        states = []
        for node, _ in ranks:
            try:
                states.append((node, AgentClient.for_node(node).get(replica.name)))
            except AgentCallFailed:
                return False
        lost = [(node, s) for node, s in states if s["state"] in ("failed", "stopped")]
        if lost:
            for node, _ in ranks:
                AgentClient.for_node(node).stop(replica.name, drain=0)
            node, state = lost[0]
            self._failed(replica, f"its rank on {node.name}: {state.get('reason') or state['state']}")
            return True
        if all(s["state"] == "ready" for _, s in states):
            record_memory(replica, states[0][1].get("memory") or {})
            return True
        return False

    def _failed(self, replica: Replica, reason: str) -> None:
        """Record what is true: the replica is not running (audited, as the demo's user)."""
        self.stderr.write(f"replica {replica.name} did not start: {reason}")
        replica.state = Replica.State.FAILED
        services.replica_save(instance=replica, message=f"demo: it did not start: {reason}"[:2000])
        for shard in Shard.objects.filter(replica=replica):
            services.shard_delete(instance=shard)

    def _stop_all(self) -> None:
        """The web server and the worker, then the agents (which stop their replicas)."""
        order = [c for c in self.children if not c.name.startswith("agent")] + [
            c for c in self.children if c.name.startswith("agent")
        ]
        for child in order:
            if child.process.poll() is None:
                try:
                    os.killpg(child.process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
            try:
                child.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait(timeout=10)
        foreign = [
            pid
            for directory in Path(settings.VAR_DIR, "demo").glob("*/gpus")
            for pid in stop_foreign_processes(directory)
        ]
        if self.children:
            self.stdout.write(
                "stopped: "
                + ", ".join(c.name for c in order)
                + (f", foreign process(es) {', '.join(map(str, foreign))}" if foreign else "")
            )
