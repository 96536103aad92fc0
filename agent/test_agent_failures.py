"""Replicas that fail: an engine that cannot start, exits at start, crashes once ready, or is
never ready (loading, until its deadline if it has one).

Real agent processes over real HTTP, standard library only like the agent: ``python -m unittest``
from ``agent/`` (``make test`` runs it so); the shared helpers are in agent_cases.py.
"""

from __future__ import annotations

import time
import unittest

from agent_cases import InATemporaryDirectory, WithAnAgent
from agent_testing import (
    free_port,
    process_gone,
    running_agent,
    standin_spec,
)


class TheAgent(WithAnAgent):
    """Tests against the one running agent each test is given (``WithAnAgent``)."""

    def test_an_engine_that_exits_at_start_is_failed_with_its_exit_code_and_log(self) -> None:
        agent = self.agent
        http = self.http
        http.put(
            "/v1/replicas/r1",
            json=standin_spec(port=free_port(), engine="standin", env={"STANDIN_EXIT_AT_START": "3"}),
        )

        state = agent.wait_for_state("r1", "failed")

        assert state["exit_code"] == 3
        assert "exit code 3" in state["reason"]
        assert any("told to fail at start" in line for line in state["log_tail"])
        assert any("exiting with code 3" in line for line in state["log_tail"])
        assert len(state["log_tail"]) <= 20
        assert http.get("/v1/node").json()["cards"][0]["replica"] is None

    def test_a_ready_replica_that_crashes_is_failed(self) -> None:
        agent = self.agent
        http = self.http
        http.put(
            "/v1/replicas/r1",
            json=standin_spec(port=free_port(), engine="standin", env={"STANDIN_CRASH_AFTER": "1.2"}),
        )
        agent.wait_for_state("r1", "ready")

        state = agent.wait_for_state("r1", "failed")

        assert state["exit_code"] == 137
        assert "after it was ready" in state["reason"]
        assert any("simulated crash" in line for line in state["log_tail"])

    def test_a_replica_that_never_gets_ready_stays_loading(self) -> None:
        agent = self.agent
        http = self.http
        http.put(
            "/v1/replicas/r1",
            json=standin_spec(port=free_port(), engine="standin", env={"STANDIN_NEVER_READY": "1"}),
        )
        agent.wait_for_state("r1", "loading")

        time.sleep(1.0)

        state = agent.replica("r1")
        assert state["state"] == "loading"
        assert state["reason"] == "/health says loading"
        assert state["log_tail"] == []

    def test_a_replica_not_ready_by_its_deadline_is_stopped_and_failed(self) -> None:
        agent = self.agent
        http = self.http
        http.put(
            "/v1/replicas/r1",
            json=standin_spec(
                port=free_port(), engine="standin", env={"STANDIN_NEVER_READY": "1"}, ready_timeout=1
            ),
        )

        state = agent.wait_for_state("r1", "failed", timeout=10)

        assert "not ready within 1s" in state["reason"]
        assert process_gone(state["pid"])


class AgentsOfTheirOwn(InATemporaryDirectory):
    """Tests that start agents (or the stand-in) configured their own way."""

    def test_an_engine_that_cannot_be_started_is_failed_with_the_reason(self) -> None:
        tmp_path = self.tmp_path
        with (
            running_agent(tmp_path, engines={"vllm": ["/nonexistent/vllm", "serve"]}) as agent,
            agent.client() as http,
        ):
            response = http.put("/v1/replicas/r1", json=standin_spec(port=free_port()))
            assert response.status_code == 201
            assert response.json()["state"] == "failed"
            assert "could not start /nonexistent/vllm" in response.json()["reason"]


if __name__ == "__main__":
    unittest.main()
