"""Starting replicas: from loading to ready on their cards, one process per replica however often
it is put, the cards and ports a live replica holds, and the long poll on a replica's state.

Real agent processes over real HTTP, standard library only like the agent: ``python -m unittest``
from ``agent/`` (``make test`` runs it so); the shared helpers are in agent_cases.py.
"""

from __future__ import annotations

import time
import unittest
from concurrent.futures import ThreadPoolExecutor

from agent_cases import InATemporaryDirectory, WithAnAgent, environ_of, started_replicas
from agent_fakes import running_standin
from agent_testing import free_port, request, standin_spec, wait_until


class TheAgent(WithAnAgent):
    """Tests against the one running agent each test is given (``WithAnAgent``)."""

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
        assert "CUDA_VISIBLE_DEVICES=2,1" in (agent.log_dir / "qwen-a.attempt-1.log").read_text()

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


class AgentsOfTheirOwn(InATemporaryDirectory):
    """Tests that start agents (or the stand-in) configured their own way."""

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
