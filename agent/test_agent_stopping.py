"""Stopping replicas: gracefully, or killed after the grace; what a stopped replica frees; the
refusals of DELETE (an unknown replica, a bad grace).

Real agent processes over real HTTP, standard library only like the agent: ``python -m unittest``
from ``agent/`` (``make test`` runs it so); the shared helpers are in agent_cases.py.
"""

from __future__ import annotations

import time
import unittest
from concurrent.futures import ThreadPoolExecutor

from agent_cases import WithAnAgent
from agent_testing import (
    free_port,
    process_gone,
    standin_spec,
    wait_until,
)


class TheAgent(WithAnAgent):
    """Tests against the one running agent each test is given (``WithAnAgent``)."""

    def test_a_stopped_replica_frees_its_cards_and_may_start_again_with_another_spec(self) -> None:
        agent = self.agent
        http = self.http
        http.put("/v1/replicas/r1", json=standin_spec(port=free_port(), cards=[0]))
        first = agent.wait_for_state("r1", "ready")
        assert http.delete("/v1/replicas/r1").json()["state"] == "stopped"
        assert all(card["replica"] is None for card in http.get("/v1/node").json()["cards"])

        other = http.put("/v1/replicas/r2", json=standin_spec(port=free_port(), cards=[0]))
        assert other.status_code == 201  # card 0 is free again
        again = http.put("/v1/replicas/r1", json=standin_spec(port=free_port(), cards=[1], model="bigger"))
        assert again.status_code == 201
        assert again.json()["pid"] != first["pid"]
        assert agent.wait_for_state("r1", "ready")["model"] == "bigger"

    def test_delete_kills_an_engine_that_ignores_sigterm_after_the_grace_period(self) -> None:
        agent = self.agent
        http = self.http
        spec = standin_spec(port=free_port(), engine="standin", env={"STANDIN_IGNORE_SIGTERM": "1"})
        http.put("/v1/replicas/r1", json=spec)
        pid = agent.wait_for_state("r1", "ready")["pid"]

        with ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            deleting = pool.submit(http.delete, "/v1/replicas/r1", params={"grace": 1})
            # The engine logs the SIGTERM it ignores: the agent has begun stopping it.
            wait_until(
                lambda: "SIGTERM received and ignored" in (agent.log_dir / "r1.attempt-1.log").read_text()
            )
            # While it is being stopped, its id, cards and port are still taken.
            again = http.put("/v1/replicas/r1", json=spec)
            other = http.put("/v1/replicas/r2", json={**spec, "env": {}})
            response = deleting.result()
            took = time.monotonic() - started

        assert (again.status_code, again.json()["code"]) == (409, "stopping")
        assert (other.status_code, other.json()["code"]) == (409, "card_busy")
        assert response.status_code == 200
        assert took >= 1.0
        state = response.json()
        assert state["state"] == "stopped"
        assert state["exit_code"] == -9
        assert "SIGKILL" in state["reason"]
        assert process_gone(pid)
        assert "SIGTERM received and ignored" in (agent.log_dir / "r1.attempt-1.log").read_text()

    def test_delete_stops_gracefully_and_a_second_delete_is_harmless(self) -> None:
        agent = self.agent
        http = self.http
        http.put("/v1/replicas/r1", json=standin_spec(port=free_port()))
        pid = agent.wait_for_state("r1", "loading", "ready")["pid"]

        first = http.delete("/v1/replicas/r1")
        second = http.delete("/v1/replicas/r1")

        assert (first.status_code, second.status_code) == (200, 200)
        assert first.json()["state"] == second.json()["state"] == "stopped"
        assert first.json()["exit_code"] == 0
        assert first.json()["reason"] == "stopped through the API"
        assert process_gone(pid)

    def test_unknown_replicas_are_404(self) -> None:
        http = self.http
        for method in ("GET", "DELETE"):
            response = http.request(method, "/v1/replicas/nope")
            assert (response.status_code, response.json()["code"]) == (404, "not_found")

    def test_a_bad_grace_is_refused(self) -> None:
        agent = self.agent
        http = self.http
        http.put("/v1/replicas/r1", json=standin_spec(port=free_port()))
        response = http.delete("/v1/replicas/r1", params={"grace": "soon"})
        assert (response.status_code, response.json()["code"]) == (400, "invalid_grace")
        assert agent.replica("r1")["state"] in ("starting", "loading", "ready")


if __name__ == "__main__":
    unittest.main()
