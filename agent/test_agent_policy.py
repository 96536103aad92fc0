"""The checks on a spec: the launch policy the agent always enforces (arguments, environment,
the launcher's own arguments, engines) and a spec's shape; a refused spec starts nothing.

Real agent processes over real HTTP, standard library only like the agent: ``python -m unittest``
from ``agent/`` (``make test`` runs it so); the shared helpers are in agent_cases.py.
"""

from __future__ import annotations

import unittest

from agent_cases import InATemporaryDirectory, WithAnAgent, launch, started_replicas
from agent_testing import (
    free_port,
    running_agent,
    standin_command,
    standin_spec,
)
from llmgw_policy import default_policy

AN_ARGUMENT_THE_POLICY_REFUSES_STARTS_NOTHING_CASES = [
    (["--chat-template", "/etc/passwd"], "--chat-template is refused for vllm: it reads a template file"),
    (["--max-model-len", "4096", "--chat-template=/etc/passwd"], "--chat-template is refused for vllm"),
    (["--download-dir=/tmp/x"], "--download-dir is refused for vllm: it names a directory"),
    (["--trust_remote_code"], "--trust_remote_code is refused for vllm (read as --trust-remote-code)"),
    (
        ["--trust-remote"],
        "--trust-remote is refused for vllm: its parser reads it as --trust-remote-code",
    ),
    (["--not-a-vllm-flag"], "--not-a-vllm-flag is refused for vllm: it is not on vllm's list"),
]


AN_ENVIRONMENT_VARIABLE_THAT_IS_REFUSED_STARTS_NOTHING_CASES = [
    ("vllm", {"VLLM_PLUGINS": "evil"}, "VLLM_PLUGINS is refused for vllm: it loads plugin packages"),
    ("vllm", {"LD_PRELOAD": "/tmp/x.so"}, "LD_PRELOAD is refused for vllm: the dynamic loader"),
    ("freetoken", {"FREETOKEN_BUILD_DIR": "/tmp"}, "FREETOKEN_BUILD_DIR is refused for freetoken"),
    ("vllm", {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "CUDA_VISIBLE_DEVICES is set by the node agent"),
    ("vllm", {"NVIDIA_VISIBLE_DEVICES": "all"}, "NVIDIA_VISIBLE_DEVICES is set by the node agent"),
    ("vllm", {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, "CUDA_DEVICE_ORDER is set by the node agent"),
    ("vllm", {"LLMGW_REPLICA_PORT": "1"}, "LLMGW_REPLICA_PORT is refused for vllm: LLMGW_ variables"),
    # The stand-in's own variables (never ready, crash, ignore SIGTERM) on a real engine.
    ("vllm", {"STANDIN_NEVER_READY": "1"}, "STANDIN_NEVER_READY is refused for vllm: STANDIN_ variables"),
    ("sglang", {"STANDIN_IGNORE_SIGTERM": "1"}, "STANDIN_IGNORE_SIGTERM is refused for sglang"),
    ("standin", {"STANDIN_MEMORY": "weights=1,path=2"}, "names the figure 'path', which is not one of"),
    ("standin", {"STANDIN_MEMORY": "weights=99999999"}, "has weights=99999999, above 16777216"),
]


ENGINES_OF_THE_POLICY = ("vllm", "sglang", "trtllm", "llamacpp", "freetoken", "standin")


class TheAgent(WithAnAgent):
    """Tests against the one running agent each test is given (``WithAnAgent``)."""

    def test_an_argument_the_policy_refuses_starts_nothing(self) -> None:
        agent = self.agent
        http = self.http
        for args, named in AN_ARGUMENT_THE_POLICY_REFUSES_STARTS_NOTHING_CASES:
            with self.subTest(named=named):
                response = http.put("/v1/replicas/r1", json=standin_spec(port=free_port(), args=args))

                assert response.status_code == 400
                assert response.json()["code"] == "refused_arg"
                assert response.json()["detail"].startswith(named)
                assert http.get("/v1/replicas").json() == []
                assert started_replicas(agent) == 0

    def test_an_environment_variable_that_is_refused_starts_nothing(self) -> None:
        agent = self.agent
        http = self.http
        for engine, env, named in AN_ENVIRONMENT_VARIABLE_THAT_IS_REFUSED_STARTS_NOTHING_CASES:
            with self.subTest(named=named):
                response = http.put(
                    "/v1/replicas/r1", json=standin_spec(port=free_port(), engine=engine, env=env)
                )

                assert response.status_code == 400
                assert response.json()["code"] == "refused_env"
                assert named in response.json()["detail"]
                assert http.get("/v1/replicas").json() == []
                assert started_replicas(agent) == 0

    def test_the_control_planes_own_launch_arguments_pass_but_the_same_flags_after_them_do_not(self) -> None:
        agent = self.agent
        http = self.http
        port = free_port()
        args = launch("freetoken", source="Qwen/Qwen2.5-7B-Instruct", port=port, model="qwen-7b")
        spec = standin_spec(
            port=port,
            engine="freetoken",
            model="qwen-7b",
            args=[*args, "--max-seq-len-override", "8192"],
            launch=False,
        )

        assert http.put("/v1/replicas/ok", json=spec).status_code == 201
        assert agent.wait_for_state("ok", "ready")["model"] == "qwen-7b"

        smuggled = http.put("/v1/replicas/r2", json={**spec, "cards": [1], "args": [*args, "--model", "/x"]})
        assert (smuggled.status_code, smuggled.json()["code"]) == (400, "refused_arg")
        as_source = launch("vllm", source="--chat-template=/x", port=port, model="qwen-7b")
        as_source_response = http.put(
            "/v1/replicas/r3", json={**spec, "engine": "vllm", "cards": [2], "args": as_source}
        )
        assert (as_source_response.status_code, as_source_response.json()["code"]) == (400, "refused_source")
        missing = http.put(
            "/v1/replicas/r4", json={**spec, "cards": [3], "args": ["--max-seq-len-override", "8"]}
        )
        assert (missing.status_code, missing.json()["code"]) == (400, "launch_mismatch")

    def test_launch_arguments_that_name_another_port_or_model_are_refused(self) -> None:
        agent = self.agent
        http = self.http
        port = free_port()
        wrong_port = http.put(
            "/v1/replicas/r1",
            json=standin_spec(
                port=port,
                model="m",
                args=launch("vllm", source="org/m", port=port + 1, model="m"),
                launch=False,
            ),
        )
        wrong_model = http.put(
            "/v1/replicas/r1",
            json=standin_spec(
                port=port,
                model="m",
                args=launch("vllm", source="org/m", port=port, model="other"),
                launch=False,
            ),
        )

        assert (wrong_port.status_code, wrong_port.json()["code"]) == (400, "launch_mismatch")
        assert f"port {port + 1}" in wrong_port.json()["detail"]
        assert (wrong_model.status_code, wrong_model.json()["code"]) == (400, "launch_mismatch")
        assert started_replicas(agent) == 0

    def test_every_engine_of_the_policy_starts_with_the_launchers_own_arguments(self) -> None:
        for engine in ENGINES_OF_THE_POLICY:
            with self.subTest(engine=engine):
                response = self.http.put(
                    f"/v1/replicas/{engine}", json=standin_spec(port=free_port(), engine=engine)
                )
                assert response.status_code == 201, response.json()
                assert self.agent.wait_for_state(engine, "ready")["engine"] == engine
                self.http.delete(f"/v1/replicas/{engine}")
                self.agent.wait_for_state(engine, "stopped")

    def test_a_spec_of_the_wrong_shape_is_refused_with_a_sentence_naming_the_field(self) -> None:
        agent = self.agent
        http = self.http
        port = free_port()
        cases = [
            ("/v1/replicas/bad%20id", standin_spec(port=port), "invalid_spec", "Replica id"),
            ("/v1/replicas/r1", {**standin_spec(port=port), "engine": "nope"}, "unknown_engine", "'nope'"),
            ("/v1/replicas/r1", standin_spec(port=port, cards=[7]), "unknown_card", "Card 7"),
            ("/v1/replicas/r1", standin_spec(port=port, cards=[1, 1]), "invalid_spec", "twice"),
            ("/v1/replicas/r1", {**standin_spec(port=port), "port": 80}, "invalid_spec", "'port'"),
            ("/v1/replicas/r1", {**standin_spec(port=port), "args": "--x 1"}, "invalid_spec", "'args'"),
            ("/v1/replicas/r1", {**standin_spec(port=port), "env": {"A": 1}}, "invalid_spec", "A"),
            ("/v1/replicas/r1", {**standin_spec(port=port), "card": [0]}, "invalid_spec", "'card'"),
            ("/v1/replicas/r1", {"engine": "vllm"}, "invalid_spec", "'model'"),
        ]
        for path, body, code, named in cases:
            response = http.put(path, json=body)
            assert response.status_code == 400, (path, body, response.text)
            assert (response.json()["code"], named in response.json()["detail"]) == (code, True), (
                response.json()
            )
        not_json = http.put("/v1/replicas/r1", content=b"{nope", headers={"Content-Type": "application/json"})
        assert (not_json.status_code, not_json.json()["code"]) == (400, "invalid_json")
        assert http.get("/v1/replicas").json() == []
        assert started_replicas(agent) == 0


class AgentsOfTheirOwn(InATemporaryDirectory):
    """Tests that start agents (or the stand-in) configured their own way."""

    def test_an_engine_missing_from_the_policy_is_refused(self) -> None:
        tmp_path = self.tmp_path
        engines = {"vllm": standin_command(), "mystery": standin_command()}
        with running_agent(tmp_path, engines=engines) as agent, agent.client() as http:
            spec = standin_spec(port=free_port(), launch=False)
            response = http.put("/v1/replicas/r1", json={**spec, "engine": "mystery"})
            assert (response.status_code, response.json()["code"]) == (400, "unknown_engine")
            assert "not in the launch policy" in response.json()["detail"]

    def test_the_agent_always_enforces_the_policy_and_reports_its_hash(self) -> None:
        tmp_path = self.tmp_path
        with running_agent(tmp_path) as agent, agent.client() as http:
            chat = http.put(
                "/v1/replicas/r1", json=standin_spec(port=free_port(), args=["--chat-template=x"])
            )
            order = http.put(
                "/v1/replicas/r2",
                json=standin_spec(port=free_port(), cards=[1], env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}),
            )
            node = http.get("/v1/node").json()

        assert (chat.status_code, chat.json()["code"]) == (400, "refused_arg")
        assert (order.status_code, order.json()["code"]) == (400, "refused_env")
        assert node["policy"] == default_policy().digest

    def test_another_copy_of_the_policy_is_enforced_and_reported(self) -> None:
        tmp_path = self.tmp_path
        policy = tmp_path / "policy.toml"
        policy.write_text(
            default_policy()
            .path.read_text()
            .replace('"--max-num-seqs" = { value = "int", min = 1, max = 65536, src = "args" }\n', "")
        )
        with running_agent(tmp_path / "agent", policy_file=policy) as agent, agent.client() as http:
            response = http.put(
                "/v1/replicas/r1", json=standin_spec(port=free_port(), args=["--max-num-seqs", "8"])
            )
            node = http.get("/v1/node").json()

        assert (response.status_code, response.json()["code"]) == (400, "refused_arg")
        assert "--max-num-seqs is refused for vllm: it is not on vllm's list" in response.json()["detail"]
        assert node["policy"] != default_policy().digest and node["policy"].startswith("sha256:")


if __name__ == "__main__":
    unittest.main()
