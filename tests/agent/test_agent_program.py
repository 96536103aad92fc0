"""The agent runs the program it is configured with, found on its own PATH,
whatever a spec or its caller's environment says.

No Django here: ``python -m pytest -p no:django tests/agent/test_agent_program.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest
from agent_testing import STANDIN, free_port, running_agent, standin_spec

PROGRAM = "llmgw-test-engine"


def _program(directory: Path, mark: str) -> Path:
    """An engine called PROGRAM in ``directory`` that says which one it is in its argv."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / PROGRAM
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" --{mark} "$@"\n')
    path.chmod(0o755)
    return directory


@pytest.fixture
def two_programs(tmp_path: Path) -> tuple[Path, Path]:
    return _program(tmp_path / "agents-bin", "from-the-agents-path"), _program(
        tmp_path / "callers-bin", "from-elsewhere"
    )


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("PATH", "CALLERS", "which program runs"),
        ("LD_AUDIT", "/tmp/audit.so", "dynamic loader"),
        ("LD_PRELOAD", "/tmp/preload.so", "dynamic loader"),
        ("PYTHONUSERBASE", "/tmp/userbase", "Python interpreter"),
        ("PYTHONPATH", "/tmp/site", "Python interpreter"),
        ("HOME", "/tmp/home", "configuration and cache directory"),
    ],
)
def test_a_real_agent_refuses_a_spec_that_would_change_what_runs(tmp_path, two_programs, name, value, why):
    agents_bin, callers_bin = two_programs
    value = str(callers_bin) if value == "CALLERS" else value
    env = {"PATH": f"{agents_bin}:/usr/bin:/bin"}
    with (
        running_agent(tmp_path / "agent", engines={"vllm": [PROGRAM]}, env=env) as agent,
        agent.client() as http,
    ):
        response = http.put("/v1/replicas/r1", json=standin_spec(port=free_port(), env={name: value}))

        assert (response.status_code, response.json()["code"]) == (400, "refused_env")
        assert response.json()["detail"].startswith(f"The environment variable {name} is refused for vllm: ")
        assert why in response.json()["detail"]
        assert http.get("/v1/replicas").json() == []


def test_without_them_the_agent_runs_its_configured_program_whatever_the_callers_path(
    tmp_path, two_programs, monkeypatch
):
    agents_bin, callers_bin = two_programs
    # The caller (this test process) would find the other program first.
    monkeypatch.setenv("PATH", f"{callers_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    env = {"PATH": f"{agents_bin}:/usr/bin:/bin"}
    with (
        running_agent(tmp_path / "agent", engines={"vllm": [PROGRAM]}, env=env) as agent,
        agent.client() as http,
    ):
        port = free_port()
        response = http.put("/v1/replicas/r1", json=standin_spec(port=port, env={"HF_HUB_OFFLINE": "1"}))
        assert response.status_code == 201, response.json()
        state = agent.wait_for_state("r1", "ready")
        facts = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5, trust_env=False).json()["standin"]
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{state['pid']}/environ").read_text().split("\0")
            if "=" in item
        )

    assert "--from-the-agents-path" in facts["argv"]
    assert "--from-elsewhere" not in facts["argv"]
    assert environ["PATH"] == f"{agents_bin}:/usr/bin:/bin"  # the agent's, not the caller's
    assert environ["HF_HUB_OFFLINE"] == "1"


def test_a_program_missing_from_the_agents_path_fails_the_replica_saying_so(tmp_path):
    with (
        running_agent(
            tmp_path / "agent", engines={"vllm": ["no-such-engine-program"]}, env={"PATH": "/usr/bin:/bin"}
        ) as agent,
        agent.client() as http,
    ):
        response = http.put("/v1/replicas/r1", json=standin_spec(port=free_port()))
    assert response.status_code == 201
    assert response.json()["state"] == "failed"
    assert "no-such-engine-program is not on the agent's PATH" in response.json()["reason"]
