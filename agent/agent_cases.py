"""What the agent's own test modules (agent/test_agent_*.py) share: the base classes that give a test
a temporary directory or a running agent, and what they read of the agent and its engines.

Standard library only, like the agent; its name does not start with ``test``, so ``unittest`` does not
look for tests in it. The real agents and stand-in engines themselves are in agent_testing.py.
"""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

from agent_testing import running_agent
from llmgw_policy import default_policy, launch_args


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def started_replicas(agent) -> int:
    """How many times the agent started any engine (one header line each)."""
    return sum(log.read_text().count("llmgw-agent: starting replica") for log in agent.log_dir.glob("*.log"))


def launch(engine: str, *, source: str, port: int, model: str) -> list[str]:
    """What the control plane puts first (the launch policy's template, filled in)."""
    return launch_args(default_policy(), engine, source=source, port=port, model=model, tp=1, args=[])


class InATemporaryDirectory(unittest.TestCase):
    """Each test with a directory of its own (``self.tmp_path``), removed after it."""

    def setUp(self) -> None:
        self.tmp_path = Path(self.enterContext(tempfile.TemporaryDirectory(prefix="llmgw-agent-test-")))


class WithAnAgent(InATemporaryDirectory):
    """Each test with a running agent (``self.agent``), which enforces the launch policy it
    carries (agent/llmgw_policy/policy.toml), and a client carrying its token (``self.http``)."""

    def setUp(self) -> None:
        super().setUp()
        self.agent = self.enterContext(running_agent(self.tmp_path / "agent"))
        self.http = self.enterContext(self.agent.client())
