"""The demo shows measured memory for every replica: each stand-in plays its profile's engine, prints
that engine's start-up memory lines and holds that memory in the stand-in nvidia-smi; the demo keeps
them beside the plan, and the model page and the nodes grid show them."""

from __future__ import annotations

import subprocess
import sys
from io import StringIO

import httpx
import pytest
import standin_nvidia_smi
from agent_testing import AGENT_DIR, REPO_ROOT, free_port, wait_until
from django.core.management import call_command

from base.actor import Actor, acting_as
from catalog.models import Node, Replica, ServedModel
from demo.management.commands.demo import Command, agent_config, write_standin_models
from telemetry.services import fleet_sample
from tests.support import builders as b
from tests.web.pages_support import signed_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("audit_flushable")]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


def test_the_demo_model_pages_and_nodes_grid_show_every_replicas_measured_memory(tmp_path):
    call_command("seed_demo", "--as", "demo", stdout=StringIO(), stderr=StringIO())
    # Free ports for the agents and replicas, not the demo's fixed ones; each its own (a port found
    # free is not held until its agent or engine listens, so the next ask may find it again).
    taken: set[int] = set()

    def another_port() -> int:
        port = free_port()
        while port in taken:
            port = free_port()
        taken.add(port)
        return port

    for node in Node.objects.all():
        Node.objects.filter(pk=node.pk).update(agent_url=f"http://127.0.0.1:{another_port()}")
    for replica in Replica.objects.all():
        Replica.objects.filter(pk=replica.pk).update(port=another_port())
        if replica.rendezvous_port:  # the replica across nodes: rank 0's rendezvous port too
            Replica.objects.filter(pk=replica.pk).update(rendezvous_port=another_port())
    nodes = list(Node.objects.filter(cards__shard__isnull=False).distinct().order_by("name"))
    agents = []
    try:
        for node in nodes:
            directory = tmp_path / node.name
            directory.mkdir()
            config = directory / "agent.toml"
            config.write_text(agent_config(node, directory))
            cards = [
                {"index": c.index, "name": c.gpu_class.name, "memory_mib": c.gpu_class.memory_mib}
                for c in node.cards.select_related("gpu_class").order_by("index")
            ]
            env = standin_nvidia_smi.install(directory / "gpus", cards)
            write_standin_models(directory / "gpus")
            agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "llmgw_agent", "--config", str(config)],
                    cwd=REPO_ROOT,
                    env={"PYTHONPATH": str(AGENT_DIR), **env, "STANDIN_LOAD_SECONDS": "0.2"},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
            )
        for node in nodes:
            wait_until(
                lambda node=node: _healthy(node.agent_url), timeout=20, what=f"the agent of {node.name}"
            )
        viewer = signed_in(b.user("viewer"))
        command = Command(stdout=StringIO(), stderr=StringIO())
        with acting_as(Actor(via="cli", name="demo")):  # as the demo command runs it
            command._start_replicas(nodes)
        said = command.stdout.getvalue() + command.stderr.getvalue()

        replicas = list(Replica.objects.filter(state__in=Replica.LIVE_STATES).select_related("profile"))
        assert len(replicas) == 7, said  # the one across two nodes among them, every rank started
        held: dict[str, float] = {}
        for replica in replicas:
            measured, engine = replica.measured_memory, replica.profile.engine
            assert measured.get("card_bytes"), (replica.name, measured)
            assert replica.planned_memory.get("need"), replica.name
            if engine in ("vllm", "sglang", "llamacpp"):
                assert measured.get("weights") and measured.get("kv_cache"), (replica.name, measured)
                assert "missing" not in measured, (replica.name, measured["missing"])
            held[engine] = measured["card_bytes"] / 2**30
        # vLLM and SGLang take their fraction of the card; llama.cpp and FreeToken what they need.
        assert held["vllm"] > 30 and held["sglang"] > 60
        assert held["llamacpp"] < 6 and held["freetoken"] < 20

        for model in ServedModel.objects.filter(profiles__replicas__isnull=False).distinct():
            page = viewer.get(f"/models/{model.name}/").content.decode()
            rows = page.split('class="num memory-need">')[1:]
            assert rows, model.name
            for row in rows:
                cell = row.split("</td>", 1)[0]
                assert "not reported" not in cell and "GiB" in cell, (model.name, cell)
                assert "did not print" not in cell, (model.name, cell)

        fleet_sample()
        l1 = viewer.get("/nodes/gpu-l1/").content.decode()
        # the nodes grid: each busy card as much as its engine holds there (nvidia-smi), so gpu-l1's
        # llama.cpp cards show what llama.cpp needs and its FreeToken card what FreeToken needs
        for name in ("mistral-7b-1", "gpt-oss-20b-1"):
            per_card_mib = Replica.objects.get(name=name).measured_memory["card_bytes"] / 2**20
            assert f"used {per_card_mib / 1024:.1f} of 45.0 GiB" in l1, (name, per_card_mib)
        h1 = viewer.get("/nodes/gpu-h1/").content.decode()
        vllm_mib = Replica.objects.get(name="llama-3.1-8b-1").measured_memory["card_bytes"] / 2**20
        assert f"used {vllm_mib / 1024:.1f} of 79.6 GiB" in h1
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            agent.wait(timeout=30)
