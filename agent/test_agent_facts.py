"""What the agent reports of its node (GET /v1/node): the engines installed with their releases, the
driver and CUDA versions nvidia-smi reports (here the stand-in's), the machine's architecture."""

from __future__ import annotations

import platform
import sys
import tempfile
import unittest
from pathlib import Path

from agent_fakes import standin_gpus
from agent_testing import STANDIN_RELEASES, running_agent, standin_command
from llmgw_agent.config import EngineConfig
from llmgw_agent.facts import engine_version

CARDS = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}]


def script(path: Path, body: str) -> Path:
    path.write_text(body)
    path.chmod(0o755)
    return path


class TheNodesFacts(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="llmgw-facts-")))

    def node(self, **config) -> dict:
        agent = self.enterContext(running_agent(self.tmp / "agent", cards=CARDS, **config))
        http = self.enterContext(agent.client())
        response = http.get("/v1/node")
        self.assertEqual(response.status_code, 200, response.text)
        return response.json()

    def test_a_stand_in_node_reports_the_driver_cuda_and_architecture_it_was_given_and_its_engines(self):
        env = standin_gpus(self.tmp / "gpus", CARDS, driver="575.57.08", cuda="12.9")
        body = self.node(env=env, extra={"arch": "aarch64"})
        self.assertEqual((body["driver_version"], body["cuda_version"]), ("575.57.08", "12.9"))
        self.assertEqual(body["arch"], "aarch64")
        self.assertEqual(body["engines"], STANDIN_RELEASES)
        self.assertEqual(body["facts_errors"], [])

    def test_without_nvidia_smi_the_driver_is_not_guessed_and_the_architecture_is_the_machines(self):
        env = {"PATH": "/nonexistent"}
        body = self.node(env=env)
        self.assertEqual((body["driver_version"], body["cuda_version"]), ("", ""))
        self.assertEqual(body["arch"], platform.machine())
        self.assertTrue(any(e.startswith("nvidia-smi: ") for e in body["facts_errors"]), body["facts_errors"])


class AnEnginesRelease(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="llmgw-facts-")))

    def test_a_python_engines_release_is_its_packages_metadata_read_by_its_own_python(self):
        # A site with vllm 0.19.1 installed (its dist-info, as pip leaves it), and a Python that sees it.
        site = self.tmp / "site"
        (site / "vllm-0.19.1.dist-info").mkdir(parents=True)
        (site / "vllm-0.19.1.dist-info" / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: vllm\nVersion: 0.19.1\n"
        )
        python = script(
            self.tmp / "python3-engine", f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n'
        )
        # The engine's command is that Python: it is asked.
        self.assertEqual(
            engine_version("vllm", EngineConfig("vllm", (str(python), "-m", "vllm"))), ("0.19.1", "")
        )
        # A console script whose #! names it: it is found through the script.
        entry = script(self.tmp / "vllm", f"#!{python}\nimport sys\n")
        self.assertEqual(engine_version("vllm", EngineConfig("vllm", (str(entry), "serve"))), ("0.19.1", ""))
        # Not installed there: not known, and why.
        version, why = engine_version("sglang", EngineConfig("sglang", (str(python), "-m", "sglang")))
        self.assertEqual(version, "")
        self.assertIn("package sglang is not installed", why)

    def test_llama_cpps_release_is_the_build_its_binary_prints(self):
        binary = script(
            self.tmp / "llama-server",
            "#!/bin/sh\necho 'version: 6500 (1a2b3c4d)' >&2\necho 'built with cc for x86_64-linux-gnu' >&2\n",
        )
        self.assertEqual(engine_version("llamacpp", EngineConfig("llamacpp", (str(binary),))), ("b6500", ""))

    def test_a_declared_release_is_taken_as_declared(self):
        config = EngineConfig("vllm", tuple(standin_command()), version="0.11.0")
        self.assertEqual(engine_version("vllm", config), ("0.11.0", ""))


if __name__ == "__main__":
    unittest.main()
