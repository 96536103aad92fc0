"""The agent's token (every endpoint refuses a request without it, and no log or engine sees it)
and the secrets of a spec (kept out of the command line, the log and the API).

Real agent processes over real HTTP, standard library only like the agent: ``python -m unittest``
from ``agent/`` (``make test`` runs it so); the shared helpers are in agent_cases.py.
"""

from __future__ import annotations

import json
import unittest
from pathlib import Path

from agent_cases import InATemporaryDirectory, WithAnAgent, environ_of, started_replicas
from agent_testing import (
    Client,
    free_port,
    running_agent,
    standin_spec,
)


class TheAgent(WithAnAgent):
    """Tests against the one running agent each test is given (``WithAnAgent``)."""

    def test_every_endpoint_answers_401_without_the_right_token_and_never_logs_it(self) -> None:
        agent = self.agent
        http = self.http
        wrong = "not-the-token-" + agent.token[:6]
        endpoints = [
            ("GET", "/v1/node", None),
            ("GET", "/v1/replicas", None),
            ("GET", "/v1/replicas/r1", None),
            ("PUT", "/v1/replicas/r1", standin_spec(port=free_port())),
            ("DELETE", "/v1/replicas/r1", None),
            ("GET", "/v1/no-such-endpoint", None),
        ]
        bad_headers = [
            {},
            {"Authorization": f"Bearer {wrong}"},
            {"Authorization": f"Bearer {agent.token}x"},
            {"Authorization": f"Basic {agent.token}"},
            {"Authorization": agent.token},
            {"Authorization": "Bearer"},
        ]
        with Client(agent.base_url, timeout=10) as anonymous:
            for method, path, body in endpoints:
                for headers in bad_headers:
                    response = anonymous.request(method, path, json=body, headers=headers)
                    assert response.status_code == 401, (method, path, headers)
                    assert response.json()["code"] == "unauthorized"
                    assert response.json()["detail"]
            assert anonymous.get("/healthz").json() == {"status": "ok"}

        assert http.get("/v1/replicas").json() == []
        assert started_replicas(agent) == 0
        output = agent.output()
        assert "GET /v1/node" in output  # requests are logged ...
        assert agent.token not in output  # ... but never the token or the header
        assert wrong not in output
        assert "Authorization" not in output

    def test_secret_looking_argument_values_stay_out_of_the_log_and_the_api(self) -> None:
        agent = self.agent
        http = self.http
        secret = "sk-" + "q" * 20
        # On the command line a key is refused (anyone on the node could read it in ps) ...
        on_the_line = http.put(
            "/v1/replicas/r0",
            json=standin_spec(port=free_port(), args=["--api-key", secret, "--hf-token=" + secret]),
        )
        assert (on_the_line.status_code, on_the_line.json()["code"]) == (400, "refused_arg")
        assert "VLLM_API_KEY" in on_the_line.json()["detail"]
        assert secret not in on_the_line.text
        # ... and reaches the engine through the environment, whose values the agent never shows.
        http.put(
            "/v1/replicas/r1",
            json=standin_spec(port=free_port(), env={"VLLM_API_KEY": secret, "HF_TOKEN": secret}),
        )

        state = agent.wait_for_state("r1", "ready")

        assert secret not in json.dumps(state)
        assert secret in Path(f"/proc/{state['pid']}/environ").read_text()  # the engine gets it
        header = (agent.log_dir / "r1.attempt-1.log").read_text().splitlines()[0]
        assert "llmgw-agent: starting replica r1" in header
        assert "VLLM_API_KEY" in header and secret not in header
        assert secret not in agent.output()


class AgentsOfTheirOwn(InATemporaryDirectory):
    """Tests that start agents (or the stand-in) configured their own way."""

    def test_the_token_may_come_from_the_environment_and_engines_never_see_it(self) -> None:
        tmp_path = self.tmp_path
        with running_agent(tmp_path, token_in_env=True) as agent, agent.client() as http:
            assert http.get("/v1/node").status_code == 200
            port = free_port()
            assert http.put("/v1/replicas/r1", json=standin_spec(port=port)).status_code == 201
            state = agent.wait_for_state("r1", "ready")
            environ = environ_of(state["pid"])
            assert "LLMGW_AGENT_TOKEN" not in environ
            assert agent.token not in "".join(environ.values())
            assert agent.token not in agent.output()


if __name__ == "__main__":
    unittest.main()
