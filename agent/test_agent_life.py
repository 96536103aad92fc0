"""The agent's own life: its replicas through its restart (adopted) and its exit
(stop_children_on_exit), the cards its node reports, and a configuration it refuses to start with.

Real agent processes over real HTTP, standard library only like the agent: ``python -m unittest``
from ``agent/`` (``make test`` runs it so); the shared helpers are in agent_cases.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any

from agent_cases import InATemporaryDirectory
from agent_testing import (
    AGENT_DIR,
    H100,
    STANDIN_RELEASES,
    free_port,
    process_gone,
    running_agent,
    standin_spec,
    toml_config,
    wait_until,
)
from llmgw_policy import default_policy

A_BAD_CONFIGURATION_STOPS_THE_AGENT_NAMING_THE_KEY_CASES: list[tuple[dict[str, Any], dict[str, str], str]] = [
    ({"node": "n"}, {}, "token: required"),
    ({"node": "n", "token": "t", "colour": "blue"}, {}, "unknown configuration key 'colour'"),
    ({"node": "n", "token": "t", "stop_grace_seconds": -1}, {}, "stop_grace_seconds"),
    (
        {"node": "n", "token": "t"},
        {"LLMGW_AGENT_READY_POLL_SECONDS": "often"},
        "LLMGW_AGENT_READY_POLL_SECONDS",
    ),
    ({"node": "n", "token": "t", "engines_registry": "/x.toml"}, {}, "engines_registry: replaced"),
    ({"node": "n", "token": "t", "policy_file": "/nonexistent.toml"}, {}, "policy_file"),
    ({"node": "n", "token": "t", "model_roots": ["relative"]}, {}, "model_roots"),
    ({"node": "n", "token": "t", "tls_cert_file": "/etc/hostname"}, {}, "tls_cert_file and tls_key_file"),
]


class AgentsOfTheirOwn(InATemporaryDirectory):
    """Tests that start agents (or the stand-in) configured their own way."""

    def test_replicas_outlive_an_agent_restart_and_are_adopted(self) -> None:
        tmp_path = self.tmp_path
        port = free_port()
        with running_agent(tmp_path, port=port, stop_children_on_exit=False) as first, first.client() as http:
            http.put("/v1/replicas/keep", json=standin_spec(port=free_port(), cards=[0]))
            http.put("/v1/replicas/lost", json=standin_spec(port=free_port(), cards=[1]))
            kept = first.wait_for_state("keep", "ready")
            lost = first.wait_for_state("lost", "ready")
            assert first.stop() == 0
            assert not process_gone(kept["pid"])
            first.known_pids.discard(kept["pid"])  # the helper's cleanup must leave it to the next agent
            os.killpg(lost["pid"], 9)  # dies while no agent watches it
            wait_until(lambda: process_gone(lost["pid"]), what="the lost replica to die")

        with running_agent(tmp_path, port=port) as second, second.client() as http:
            second.known_pids.add(kept["pid"])
            adopted = second.replica("keep")
            assert (adopted["state"], adopted["pid"], adopted["adopted"]) == ("ready", kept["pid"], True)
            gone = second.replica("lost")
            assert gone["state"] == "failed"
            assert "while the agent was not running" in gone["reason"]
            assert http.get("/v1/node").json()["cards"][0]["replica"] == "keep"
            assert (
                http.put("/v1/replicas/other", json=standin_spec(port=free_port(), cards=[0])).json()["code"]
                == "card_busy"
            )

            stopped = http.delete("/v1/replicas/keep").json()
            assert stopped["state"] == "stopped"
            assert process_gone(kept["pid"])

    def test_stop_children_on_exit_stops_every_replica_with_the_agent(self) -> None:
        tmp_path = self.tmp_path
        with running_agent(tmp_path, stop_children_on_exit=True) as agent, agent.client() as http:
            http.put("/v1/replicas/r1", json=standin_spec(port=free_port()))
            pid = agent.wait_for_state("r1", "ready")["pid"]
            assert agent.stop() == 0
            assert process_gone(pid)
        saved = json.loads((agent.log_dir / "replicas.json").read_text())["replicas"]
        assert [(r["id"], r["state"], r["reason"]) for r in saved] == [
            ("r1", "stopped", "stopped with the agent")
        ]

    def test_node_reports_its_cards_from_the_configuration(self) -> None:
        tmp_path = self.tmp_path
        cards = [
            {"index": 0, "name": H100, "memory_mib": 81559},
            {"index": 1, "name": "NVIDIA L4", "memory_mib": 23034},
        ]
        with running_agent(tmp_path, node="gpu-a1", cards=cards, env={"PATH": "/usr/bin:/bin"}) as agent:
            node = agent.client().get("/v1/node").json()
        assert node == {
            "node": "gpu-a1",
            "cards": [
                {"index": 0, "name": H100, "memory_mib": 81559, "replica": None},
                {"index": 1, "name": "NVIDIA L4", "memory_mib": 23034, "replica": None},
            ],
            "agent_version": node["agent_version"],
            "cards_source": "config",
            "policy": default_policy().digest,
            # What it says of its node (test_agent_facts.py): no nvidia-smi on this PATH, so no driver.
            "driver_version": "",
            "cuda_version": "",
            "arch": node["arch"],
            "engines": STANDIN_RELEASES,
            "facts_errors": ["nvidia-smi: not on the PATH"],
        }

    def test_node_reports_its_cards_from_nvidia_smi_when_it_works(self) -> None:
        tmp_path = self.tmp_path
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "nvidia-smi"
        fake.write_text(
            "#!/bin/sh\nprintf '0, NVIDIA A100-SXM4-80GB, 81920\\n1, NVIDIA A100-SXM4-80GB, 81920\\n'\n"
        )
        fake.chmod(0o755)
        with running_agent(
            tmp_path / "a", cards=[], env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}
        ) as agent:
            node = agent.client().get("/v1/node").json()
        assert node["cards_source"] == "nvidia-smi"
        assert [(c["index"], c["name"], c["memory_mib"]) for c in node["cards"]] == [
            (0, "NVIDIA A100-SXM4-80GB", 81920),
            (1, "NVIDIA A100-SXM4-80GB", 81920),
        ]

    def test_a_bad_configuration_stops_the_agent_naming_the_key(self) -> None:
        tmp_path = self.tmp_path
        for config, env, named in A_BAD_CONFIGURATION_STOPS_THE_AGENT_NAMING_THE_KEY_CASES:
            with self.subTest(named=named):
                case_dir = Path(tempfile.mkdtemp(dir=tmp_path))
                values = {"listen": f"127.0.0.1:{free_port()}", "log_dir": str(case_dir / "logs"), **config}
                values["engines"] = {"vllm": {"command": [sys.executable, "x"]}}
                path = case_dir / "agent.toml"
                path.write_text(toml_config(values))
                clean_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
                done = subprocess.run(
                    [sys.executable, "-m", "llmgw_agent", "--config", str(path)],
                    env={**clean_env, "PYTHONPATH": str(AGENT_DIR), **env},
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                assert done.returncode == 2
                assert named in done.stderr


if __name__ == "__main__":
    unittest.main()
