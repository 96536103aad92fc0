"""The demo launcher's parts: the agent it configures from the catalog really runs the profiles' engines."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from agent_testing import AGENT_DIR, REPO_ROOT, free_port, wait_until

from catalog.models import Profile
from demo.management.commands.demo import agent_config, port_clashes
from operations.services.specs import replica_spec
from planning import engines
from tests.support import builders as b

pytestmark = pytest.mark.django_db


def test_the_demo_agent_has_the_nodes_cards_and_runs_every_engine_as_the_stand_in(tmp_path):
    node = b.node(
        "gpu-l1",
        cards=2,
        agent_url=f"http://127.0.0.1:{free_port()}",
        agent_token="demo-agent-token-for-gpu-l1-not-secret",
    )
    config = tmp_path / "agent.toml"
    config.write_text(agent_config(node, tmp_path))
    agent = subprocess.Popen(
        [sys.executable, "-m", "llmgw_agent", "--config", str(config)],
        cwd=REPO_ROOT,
        # A real engine's profile may not set STANDIN_ variables: the agent's environment, which its
        # engines inherit, makes the stand-in quick.
        env={"PYTHONPATH": str(AGENT_DIR), "PATH": "/usr/bin:/bin", "STANDIN_LOAD_SECONDS": "0.2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        http = httpx.Client(
            base_url=node.agent_url,
            headers={"Authorization": f"Bearer {node.agent_token}"},
            timeout=10,
            trust_env=False,
        )
        wait_until(lambda: _healthy(http), timeout=15, what="the demo agent")
        cards = http.get("/v1/node").json()["cards"]
        assert [(c["index"], c["name"], c["memory_mib"]) for c in cards] == [
            (0, "h100-80g", 81559),
            (1, "h100-80g", 81559),
        ]
        # A FreeToken profile passes the agent's own refusals (the registry's launch template first).
        model = b.llama_8b("gpt-oss-20b")
        profile = Profile.objects.create(
            model=model,
            name="l40s",
            engine="freetoken",
            gpu_class=b.gpu_class(),
            args=["--max-seq-len-override", "32768"],
        )
        spec = replica_spec(profile, port=free_port(), cards=[1])
        assert http.put("/v1/replicas/gpt-1", json=spec).status_code == 201
        wait_until(
            lambda: http.get("/v1/replicas/gpt-1").json()["state"] == "ready",
            timeout=15,
            what="the FreeToken stand-in to be ready",
        )
        assert set(engines.registry()) <= set(config.read_text().split('"')[1::2])
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def _healthy(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def test_replicas_sharing_a_port_on_one_machine_are_given_another(settings):
    settings.LLMGW_REPLICA_PORT_BASE = 8100
    profile = b.profile(b.llama_8b())
    b.replica(profile, b.node("gpu-h1", cards=1, agent_url="http://127.0.0.1:9101"), [0], name="a", port=8001)
    b.replica(profile, b.node("gpu-h2", cards=1, agent_url="http://127.0.0.1:9102"), [0], name="b", port=8001)
    b.replica(profile, b.node("gpu-far", cards=1, agent_url="http://10.0.0.9:9101"), [0], name="c", port=8001)
    assert [(r.name, port) for r, port in port_clashes()] == [("b", 8100)]
