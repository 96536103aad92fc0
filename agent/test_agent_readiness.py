"""Readiness by generation, and stops that drain: an engine that answers /health and /v1/models but
cannot generate is never ready; the readiness probe authenticates with the replica's own API key;
a stop waits for the engine's requests in flight (its /metrics), up to the drain deadline.

Real agent processes and stand-in engines over real HTTP, standard library only like the agent:
``python -m unittest test_agent_readiness`` from ``agent/``.
"""

from __future__ import annotations

import time
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent_cases import InATemporaryDirectory, WithAnAgent
from agent_http import TransportError, request
from agent_testing import free_port, process_gone, running_agent, standin_spec, wait_until
from llmgw_agent.probe import in_flight, probe


def complete(
    port: int, prompt: str, *, seconds: float = 0, key: str = "", model: str = "standin-model"
) -> Any:
    """A completion sent straight to the engine, as a gateway would; ``seconds``: how long the
    stand-in takes to answer it."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "standin_seconds": seconds}
    return request(
        "POST", f"http://127.0.0.1:{port}/v1/completions", json_body=body, headers=headers, timeout=30
    )


class Readiness(WithAnAgent):
    def test_an_engine_that_answers_health_and_models_but_cannot_generate_is_never_ready(self) -> None:
        port = free_port()
        spec = standin_spec(
            port=port, engine="standin", env={"STANDIN_GENERATION_FAILS": "1"}, ready_timeout=3
        )
        assert self.http.put("/v1/replicas/r1", json=spec).status_code == 201
        wait_until(
            lambda: "one-token completion answered 500" in self.agent.replica("r1")["reason"],
            what="the probe's reason to name the failed completion",
        )
        assert self.agent.replica("r1")["state"] == "loading"
        # /health and /v1/models say it is up and serving its model.
        health = request("GET", f"http://127.0.0.1:{port}/health", timeout=5)
        models = request("GET", f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert (health.status_code, health.json()["status"]) == (200, "ok")
        assert [m["id"] for m in models["data"]] == ["standin-model"]

        failed = self.agent.wait_for_state("r1", "failed", timeout=15)
        assert failed["ready_at"] is None  # never counted ready, not even for a moment
        assert "not ready within 3s" in failed["reason"]
        assert "one-token completion answered 500" in failed["reason"]
        assert "STANDIN_GENERATION_FAILS" in failed["reason"]

    def test_the_probe_authenticates_with_the_replicas_own_key_which_the_engine_requires(self) -> None:
        port = free_port()
        key = "sk-replica-own-key-1234"
        spec = standin_spec(port=port, engine="standin", env={"VLLM_API_KEY": key})
        assert self.http.put("/v1/replicas/r1", json=spec).status_code == 201
        ready = self.agent.wait_for_state("r1", "ready", timeout=15)

        assert ready["reason"] == "ready"
        # The engine does require it: without it, /v1/* answer 401; the probe with another key is refused.
        assert request("GET", f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 401
        assert complete(port, "hi").status_code == 401
        assert complete(port, "hi", key=key).status_code == 200
        assert probe(port, "standin-model", api_key="wrong-key") == ("loading", "/v1/models answered 401")
        assert probe(port, "standin-model", api_key=key) == ("ready", "ready")
        assert key not in str(self.agent.replica("r1"))


class ReadyWhenItsEngineSaysSo(InATemporaryDirectory):
    def test_a_replica_is_probed_when_its_engine_writes_to_its_log_not_only_at_each_poll(self) -> None:
        # Polled every 10 s, the replica would be seen ready 10 s after its start at the earliest;
        # the stand-in logs a line the moment it has loaded (0.5 s), and the agent probes then.
        agent = self.enterContext(running_agent(self.tmp_path / "agent", ready_poll_seconds=10))
        http = self.enterContext(agent.client())
        spec = standin_spec(port=free_port(), engine="standin", load_seconds=0.5)
        began = time.monotonic()
        assert http.put("/v1/replicas/r1", json=spec).status_code == 201
        ready = agent.wait_for_state("r1", "ready", timeout=15)
        took = time.monotonic() - began
        assert took < 5, f"seen ready {took:.1f}s after its start, at a poll rather than at its log's line"
        assert ready["reason"] == "ready"
        assert "loaded: serving standin-model" in Path(ready["log_file"]).read_text()


class Draining(WithAnAgent):
    def _ready_standin(self) -> int:
        port = free_port()
        assert (
            self.http.put("/v1/replicas/r1", json=standin_spec(port=port, engine="standin")).status_code
            == 201
        )
        self.agent.wait_for_state("r1", "ready", timeout=15)
        return port

    def test_a_stop_waits_for_the_request_in_flight_which_gets_its_whole_answer(self) -> None:
        port = self._ready_standin()
        pid = self.agent.replica("r1")["pid"]
        with ThreadPoolExecutor(2) as pool:
            slow = pool.submit(complete, port, "the whole answer please", seconds=2.0)
            wait_until(lambda: in_flight(port) == 1, what="the request to be in flight")
            started = time.monotonic()
            stopping = pool.submit(self.http.delete, "/v1/replicas/r1", params={"drain": 20})
            # While it drains the agent says so, and the engine still serves: it is not signalled yet.
            draining = wait_until(
                lambda: self.agent.replica("r1")["draining"], what="the replica to be draining"
            )
            assert draining
            answer = slow.result(timeout=30)
            stopped = stopping.result(timeout=30).json()
            took = time.monotonic() - started

        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == "echo: the whole answer please"
        assert stopped["state"] == "stopped" and stopped["exit_code"] == 0, stopped
        assert "drained: 1 request(s) in flight finished in" in stopped["reason"], stopped["reason"]
        assert stopped["draining"] is False
        assert 1.0 <= took < 15, took
        assert process_gone(pid)

    def test_a_stop_with_nothing_in_flight_does_not_wait(self) -> None:
        self._ready_standin()
        started = time.monotonic()
        stopped = self.http.delete("/v1/replicas/r1", params={"drain": 20}).json()
        assert (stopped["state"], stopped["reason"]) == ("stopped", "stopped through the API")
        assert time.monotonic() - started < 5

    def test_the_drain_deadline_bounds_the_wait_then_the_engine_is_stopped(self) -> None:
        port = self._ready_standin()
        with ThreadPoolExecutor(2) as pool:
            slow = pool.submit(complete, port, "too long", seconds=60.0)
            wait_until(lambda: in_flight(port) == 1, what="the request to be in flight")
            started = time.monotonic()
            stopped = self.http.delete("/v1/replicas/r1", params={"drain": 1, "grace": 1}).json()
            took = time.monotonic() - started
            with self.assertRaises(TransportError):  # cut off: it outlived the drain and the grace
                slow.result(timeout=30)

        assert stopped["state"] == "stopped"
        assert "1 request(s) still in flight after the drain deadline of 1s" in stopped["reason"]
        assert "SIGKILL" in stopped["reason"]  # the stand-in kept finishing it after SIGTERM
        assert 2.0 <= took < 12, took

    def test_the_engine_refuses_new_requests_once_signalled_and_a_bad_drain_is_refused(self) -> None:
        port = self._ready_standin()
        bad = self.http.delete("/v1/replicas/r1", params={"drain": "-1"})
        assert (bad.status_code, bad.json()["code"]) == (400, "invalid_drain")
        assert self.agent.replica("r1")["state"] == "ready"  # nothing changed
        with ThreadPoolExecutor(2) as pool:
            slow = pool.submit(complete, port, "in flight", seconds=2.0)
            wait_until(lambda: in_flight(port) == 1, what="the request to be in flight")
            # No drain wait from the agent: SIGTERM at once; the stand-in drains on its own (as
            # vLLM >= 0.18 with --shutdown-timeout does), refusing what comes after.
            stopping = pool.submit(self.http.delete, "/v1/replicas/r1", params={"drain": 0, "grace": 10})
            wait_until(
                lambda: "SIGTERM received" in (self.agent.log_dir / "r1.attempt-1.log").read_text(),
                what="the engine to be signalled",
            )
            refused = complete(port, "too late")
            health = request("GET", f"http://127.0.0.1:{port}/health", timeout=5)
            answer = slow.result(timeout=30)
            stopped = stopping.result(timeout=30).json()
        assert refused.status_code == 503 and health.status_code == 503
        assert answer.status_code == 200
        assert stopped["state"] == "stopped" and stopped["exit_code"] == 0


if __name__ == "__main__":
    unittest.main()
