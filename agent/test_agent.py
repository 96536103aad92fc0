"""The node agent and the stand-in engine, as real processes over real HTTP.

Standard library only, like the agent: ``python -m unittest`` from ``agent/``
(``make test`` runs it so, with no site packages at all).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent_testing import (
    AGENT_DIR,
    H100,
    Client,
    free_port,
    process_gone,
    request,
    running_agent,
    running_standin,
    standin_command,
    standin_spec,
    toml_config,
    wait_until,
)
from llmgw_policy import default_policy, launch_args


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def started_replicas(agent) -> int:
    """How many times the agent started any engine (one header line each)."""
    return sum(log.read_text().count("llmgw-agent: starting replica") for log in agent.log_dir.glob("*.log"))


# --- authentication ---------------------------------------------------------------


# --- starting and readiness -----------------------------------------------------------


# --- refusals -------------------------------------------------------------------------


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


def launch(engine: str, *, source: str, port: int, model: str) -> list[str]:
    """What the control plane puts first (the launch policy's template, filled in)."""
    return launch_args(default_policy(), engine, source=source, port=port, model=model, tp=1, args=[])


ENGINES_OF_THE_POLICY = ("vllm", "sglang", "trtllm", "llamacpp", "freetoken", "standin")


# --- failures -------------------------------------------------------------------------


# --- stopping -------------------------------------------------------------------------


# --- the agent's own life -------------------------------------------------------------


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


# --- the stand-in on its own ------------------------------------------------------------


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


class TheAgent(WithAnAgent):
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

    def test_a_replica_goes_from_loading_to_ready_on_the_cards_it_was_given(self) -> None:
        agent = self.agent
        http = self.http
        port = free_port()
        response = http.put(
            "/v1/replicas/qwen-a",
            json=standin_spec(port=port, model="qwen-7b", cards=[2, 1], load_seconds=1.0),
        )

        assert response.status_code == 201
        assert response.json()["state"] in ("starting", "loading")
        seen = []

        def ready():
            state = agent.replica("qwen-a")
            seen.append(state["state"])
            return state if state["state"] == "ready" else None

        state = wait_until(ready, timeout=15, interval=0.05, what="ready")
        assert "loading" in seen
        assert seen.index("loading") < seen.index("ready")
        assert state["ready_at"] and state["started_at"] <= state["ready_at"]
        assert (state["cards"], state["port"], state["model"], state["engine"]) == (
            [2, 1],
            port,
            "qwen-7b",
            "vllm",
        )

        models = request("GET", f"http://127.0.0.1:{port}/v1/models").json()
        assert [entry["id"] for entry in models["data"]] == ["qwen-7b"]
        assert models["standin"]["cuda_visible_devices"] == "2,1"
        environ = environ_of(state["pid"])
        assert environ["CUDA_VISIBLE_DEVICES"] == "2,1"
        assert environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert (
            environ["LLMGW_REPLICA_ID"],
            environ["LLMGW_REPLICA_PORT"],
            environ["LLMGW_SERVED_MODEL"],
        ) == (
            "qwen-a",
            str(port),
            "qwen-7b",
        )
        assert "CUDA_VISIBLE_DEVICES=2,1" in (agent.log_dir / "qwen-a.log").read_text()

        cards = {card["index"]: card["replica"] for card in http.get("/v1/node").json()["cards"]}
        assert cards == {0: None, 1: "qwen-a", 2: "qwen-a", 3: None}
        assert [replica["id"] for replica in http.get("/v1/replicas").json()] == ["qwen-a"]

        chat = request(
            "POST",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json_body={"model": "qwen-7b", "messages": [{"role": "user", "content": "hello there"}]},
        ).json()
        assert chat["choices"][0]["message"]["content"] == "echo: hello there"
        assert (
            chat["usage"]["total_tokens"]
            == chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"]
        )

    def test_putting_the_same_replica_twice_starts_one_process(self) -> None:
        agent = self.agent
        http = self.http
        spec = standin_spec(port=free_port())
        first = http.put("/v1/replicas/r1", json=spec)
        second = http.put("/v1/replicas/r1", json=spec)
        ready = agent.wait_for_state("r1", "ready")
        third = http.put("/v1/replicas/r1", json={**spec, "ready_timeout": 5})  # the deadline is not the spec

        assert (first.status_code, second.status_code, third.status_code) == (201, 200, 200)
        assert first.json()["pid"] == second.json()["pid"] == third.json()["pid"] == ready["pid"]
        assert third.json()["state"] == "ready"
        assert started_replicas(agent) == 1

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
        header = (agent.log_dir / "r1.log").read_text().splitlines()[0]
        assert "llmgw-agent: starting replica r1" in header
        assert "VLLM_API_KEY" in header and secret not in header
        assert secret not in agent.output()

    def test_concurrent_puts_start_one_process_and_give_a_card_to_one_replica(self) -> None:
        agent = self.agent
        http = self.http
        spec = standin_spec(port=free_port(), cards=[0])
        with ThreadPoolExecutor(8) as pool:
            same = list(pool.map(lambda _: http.put("/v1/replicas/r1", json=spec), range(8)))
            rivals = list(
                pool.map(
                    lambda n: http.put(
                        f"/v1/replicas/rival-{n}", json=standin_spec(port=free_port(), cards=[1])
                    ),
                    range(8),
                )
            )

        assert sorted(r.status_code for r in same) == [200] * 7 + [201]
        assert len({r.json()["pid"] for r in same}) == 1
        assert sorted(r.status_code for r in rivals) == [201] + [409] * 7
        assert {r.json()["code"] for r in rivals if r.status_code == 409} == {"card_busy"}
        assert started_replicas(agent) == 2

    def test_a_different_spec_for_a_live_replica_is_a_conflict(self) -> None:
        agent = self.agent
        http = self.http
        spec = standin_spec(port=free_port())
        pid = http.put("/v1/replicas/r1", json=spec).json()["pid"]

        for change in (
            {"args": [*spec["args"], "--max-model-len", "8192"]},
            {"cards": [1]},
            # (another port or model: the launcher's arguments say the same, as the control plane writes them)
            {"port": (other := free_port()), "args": standin_spec(port=other)["args"]},
            {"model": "other", "args": standin_spec(port=spec["port"], model="other")["args"]},
        ):
            response = http.put("/v1/replicas/r1", json={**spec, **change})
            assert response.status_code == 409, change
            assert response.json()["code"] == "spec_conflict"
            assert "r1" in response.json()["detail"]

        assert agent.replica("r1")["pid"] == pid
        assert started_replicas(agent) == 1

    def test_cards_and_ports_held_by_a_live_replica_are_busy(self) -> None:
        agent = self.agent
        http = self.http
        port = free_port()
        assert http.put("/v1/replicas/r1", json=standin_spec(port=port, cards=[0, 1])).status_code == 201

        busy_card = http.put("/v1/replicas/r2", json=standin_spec(port=free_port(), cards=[2, 1]))
        busy_port = http.put("/v1/replicas/r3", json=standin_spec(port=port, cards=[3]))

        assert busy_card.status_code == 409
        assert busy_card.json()["code"] == "card_busy"
        assert "Card 1" in busy_card.json()["detail"] and "r1" in busy_card.json()["detail"]
        assert busy_port.status_code == 409
        assert busy_port.json()["code"] == "port_busy"
        assert started_replicas(agent) == 1

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
            wait_until(lambda: "SIGTERM received and ignored" in (agent.log_dir / "r1.log").read_text())
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
        assert "SIGTERM received and ignored" in (agent.log_dir / "r1.log").read_text()

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

    # -- waiting for a change (the long poll) --

    def test_a_wait_answers_as_soon_as_the_replica_leaves_the_state_last_seen(self) -> None:
        agent, http = self.agent, self.http
        response = http.put("/v1/replicas/r1", json=standin_spec(port=free_port(), load_seconds=1.0))
        assert response.status_code == 201
        seen = agent.wait_for_state("r1", "loading")["state"]
        began = time.monotonic()
        state = http.get("/v1/replicas/r1", params={"wait": "10", "state": seen}).json()
        assert state["state"] == "ready"
        assert time.monotonic() - began < 5  # when it was ready (about 1 s of loading), not after 10 s
        # Already in another state than the one named: at once.
        ready_at = time.monotonic()
        assert (
            http.get("/v1/replicas/r1", params={"wait": "10", "state": "loading"}).json()["state"] == "ready"
        )
        assert time.monotonic() - ready_at < 2

    def test_a_wait_with_no_change_answers_after_the_wait_with_the_state_then(self) -> None:
        agent, http = self.agent, self.http
        spec = standin_spec(port=free_port(), engine="standin", env={"STANDIN_NEVER_READY": "1"})
        assert http.put("/v1/replicas/r1", json=spec).status_code == 201
        agent.wait_for_state("r1", "loading")
        began = time.monotonic()
        state = http.get("/v1/replicas/r1", params={"wait": "0.8", "state": "loading"}).json()
        assert state["state"] == "loading"
        assert 0.7 <= time.monotonic() - began < 5

    def test_a_bad_wait_is_refused(self) -> None:
        http = self.http
        assert http.put("/v1/replicas/r1", json=standin_spec(port=free_port())).status_code == 201
        for params, code in [
            ({"wait": "ages", "state": "loading"}, "invalid_wait"),
            ({"wait": "31", "state": "loading"}, "invalid_wait"),
            ({"wait": "1", "state": "asleep"}, "invalid_state"),
            ({"wait": "1"}, "invalid_state"),
        ]:
            with self.subTest(params=params):
                response = http.get("/v1/replicas/r1", params=params)
                assert response.status_code == 400 and response.json()["code"] == code
                assert response.json()["detail"]

    def test_a_port_another_program_holds_is_busy_and_nothing_starts(self) -> None:
        agent = self.agent
        http = self.http
        import socket

        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", 0))
            squatter.listen()
            port = squatter.getsockname()[1]
            response = http.put("/v1/replicas/r1", json=standin_spec(port=port, cards=[0]))
        assert response.status_code == 409
        assert response.json()["code"] == "port_busy"
        assert f"Port {port} is in use by another program" in response.json()["detail"]
        assert started_replicas(agent) == 0


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

    def test_the_standin_answers_503_on_chat_while_loading_and_lists_no_model(self) -> None:
        tmp_path = self.tmp_path
        with running_standin(tmp_path, model="m", load_seconds=30, wait_ready=False) as standin:
            assert request("GET", f"{standin.base_url}/health").json() == {"status": "loading"}
            assert request("GET", f"{standin.base_url}/v1/models").json()["data"] == []
            chat = request(
                "POST",
                f"{standin.base_url}/v1/chat/completions",
                json_body={"messages": [{"role": "user", "content": "hi"}]},
            )
            assert chat.status_code == 503
            assert f"model=m port={standin.port}" in standin.output()


if __name__ == "__main__":
    unittest.main()
