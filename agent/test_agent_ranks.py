"""A replica across nodes, rank by rank: each rank's spec carries its ``group`` and the rank
flags the launch policy makes of it; the agent refuses any other, starts its rank, and says
what it knows of it. Two real agents on 127.0.0.1 (two "nodes"), real stand-in engines that
form their group over a real TCP rendezvous (agent/standin_ranks.py).

Standard library only, like the agent: ``python -m unittest test_agent_ranks`` from ``agent/``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import unittest

from agent_cases import InATemporaryDirectory, WithAnAgent, started_replicas
from agent_testing import (
    free_port,
    process_gone,
    request,
    running_agent,
    standin_spec,
    wait_until,
)
from llmgw_policy import GroupSpec


def rank_spec(rank: int, *, port: int, rendezvous: int, engine: str = "vllm", **kw) -> dict:
    """Rank ``rank`` of a two-node replica whose rank 0 waits at 127.0.0.1:``rendezvous``."""
    group = GroupSpec(rank=rank, size=2, address="127.0.0.1", port=rendezvous)
    return standin_spec(port=port, model="big", cards=[0, 1], engine=engine, group=group, **kw)


class TwoNodeCase(InATemporaryDirectory):
    """Two agents, each a node of its own, both on 127.0.0.1 as the fleet's tests run them."""

    def setUp(self) -> None:
        super().setUp()
        env = self.agent_env()
        self.head = self.enterContext(running_agent(self.tmp_path / "a", node="gpu-a", env=env))
        self.tail = self.enterContext(running_agent(self.tmp_path / "b", node="gpu-b", env=env))
        self.head_http = self.enterContext(self.head.client())
        self.tail_http = self.enterContext(self.tail.client())
        self.port, self.rendezvous = free_port(), free_port()

    def agent_env(self) -> dict[str, str]:
        """The agents' environment, which their engines inherit."""
        return {}

    def start_group(self, **spec) -> tuple[dict, dict]:
        """Rank 0 on the head, then rank 1 on the tail; both ready."""
        first = self.head_http.put(
            "/v1/replicas/big", json=rank_spec(0, port=self.port, rendezvous=self.rendezvous, **spec)
        )
        assert first.status_code == 201, first.text
        # Rank 0 holds the serving port on this very host: the headless rank must not be refused for it.
        second = self.tail_http.put(
            "/v1/replicas/big", json=rank_spec(1, port=self.port, rendezvous=self.rendezvous, **spec)
        )
        assert second.status_code == 201, second.text
        return self.head.wait_for_state("big", "ready"), self.tail.wait_for_state("big", "ready")


class TwoNodes(TwoNodeCase):
    def test_two_ranks_form_their_group_and_rank_0_serves(self) -> None:
        head, tail = self.start_group()

        assert head["group"] == {"rank": 0, "size": 2, "address": "127.0.0.1", "port": self.rendezvous}
        assert tail["group"] == {"rank": 1, "size": 2, "address": "127.0.0.1", "port": self.rendezvous}
        assert "known only through rank 0's readiness" in tail["reason"]
        assert "--headless" in tail["args"] and "--headless" not in head["args"]
        listed = self.tail_http.get("/v1/replicas").json()
        assert [(r["id"], r["group"]["rank"]) for r in listed] == [("big", 1)]
        head_log = (self.head.log_dir / "big.attempt-1.log").read_text()
        assert "rank 0: rank 1 joined (2/2)" in head_log and "all 2 ranks joined" in head_log
        assert "joined the group of 2" in (self.tail.log_dir / "big.attempt-1.log").read_text()
        chat = request(
            "POST",
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            json_body={"model": "big", "messages": [{"role": "user", "content": "across nodes"}]},
        ).json()
        assert chat["choices"][0]["message"]["content"] == "echo: across nodes"

    def test_rank_0_waits_for_the_others_before_it_loads(self) -> None:
        first = self.head_http.put(
            "/v1/replicas/big", json=rank_spec(0, port=self.port, rendezvous=self.rendezvous)
        )
        assert first.status_code == 201, first.text
        log = self.head.log_dir / "big.attempt-1.log"
        wait_until(lambda: "waiting at 127.0.0.1" in log.read_text(), timeout=10, what="rank 0 to wait")

        alone = self.head.replica("big")
        assert alone["state"] == "starting", alone  # nothing serves until the group is whole
        with self.assertRaises(OSError):
            request("GET", f"http://127.0.0.1:{self.port}/health", timeout=1)
        self.tail_http.put("/v1/replicas/big", json=rank_spec(1, port=self.port, rendezvous=self.rendezvous))
        assert self.head.wait_for_state("big", "ready")["state"] == "ready"

    def test_a_rank_killed_takes_the_group_down_and_leaves_no_rank_running(self) -> None:
        head, tail = self.start_group()

        os.kill(tail["pid"], signal.SIGKILL)

        lost = self.tail.wait_for_state("big", "failed")
        dead_head = self.head.wait_for_state("big", "failed")
        assert "SIGKILL" in lost["reason"] or "signal 9" in lost["reason"], lost["reason"]
        assert dead_head["exit_code"] == 1
        assert "the engine's last line" in dead_head["reason"]
        assert (
            "NCCL error" in dead_head["reason"] and "connection to rank 1 of 2 dropped" in dead_head["reason"]
        )
        assert process_gone(head["pid"]) and process_gone(tail["pid"])

    def test_a_dead_rank_0_ends_its_headless_ranks(self) -> None:
        # vLLM #32136: the head died and the headless ranks looped forever. Here they exit, and the
        # agent says why in the engine's words.
        head, tail = self.start_group()

        os.kill(head["pid"], signal.SIGKILL)

        orphan = self.tail.wait_for_state("big", "failed")
        assert orphan["exit_code"] == 1
        assert "exited on its own after it was ready" in orphan["reason"]
        assert "connection to rank 0 of 2 dropped" in orphan["reason"], orphan["reason"]
        assert any("ncclRemoteError" in line for line in orphan["log_tail"])
        assert process_gone(tail["pid"])

    def test_stopping_rank_0_first_is_a_stop_there_and_ends_the_other_rank(self) -> None:
        head, tail = self.start_group()

        stopped = self.head_http.delete("/v1/replicas/big").json()

        assert stopped["state"] == "stopped"
        ended = self.tail.wait_for_state("big", "failed")
        assert "connection to rank 0 of 2 dropped" in ended["reason"]
        again = self.tail_http.delete("/v1/replicas/big")  # the control plane's stop of the group
        assert again.status_code == 200 and again.json()["state"] == "failed"
        assert process_gone(head["pid"]) and process_gone(tail["pid"])

    def test_rank_0_alone_gives_up_at_its_deadline_in_the_engines_words(self) -> None:
        spec = rank_spec(
            0, port=self.port, rendezvous=self.rendezvous, engine="standin", env={"STANDIN_JOIN_SECONDS": "1"}
        )
        assert self.head_http.put("/v1/replicas/big", json=spec).status_code == 201

        failed = self.head.wait_for_state("big", "failed")
        assert failed["exit_code"] == 1
        assert "Timed out after 1 seconds waiting for clients. 1/2 clients joined." in failed["reason"]

    def test_a_rank_with_no_rank_0_gives_up_at_its_deadline(self) -> None:
        spec = rank_spec(
            1, port=self.port, rendezvous=self.rendezvous, engine="standin", env={"STANDIN_JOIN_SECONDS": "1"}
        )
        assert self.tail_http.put("/v1/replicas/big", json=spec).status_code == 201

        failed = self.tail.wait_for_state("big", "failed")
        assert "could not join its group" in failed["reason"], failed["reason"]


LLAMA_405B = "meta-llama/Llama-3.1-405B-Instruct"


class TwoNodesWithCards(TwoNodeCase):
    """The two nodes with the stand-in's cards and model facts ($STANDIN_GPU_DIR), so each rank
    prints the memory lines of its pipeline stage, as vLLM's workers do on each node."""

    def agent_env(self) -> dict[str, str]:
        gpus = self.tmp_path / "gpus"
        gpus.mkdir()
        cards = [{"index": i, "name": "h100-80g", "memory_mib": 81559} for i in range(4)]
        (gpus / "cards.json").write_text(json.dumps(cards))
        facts = {"weight_bytes": 60 * 2**30, "kv_bytes_per_token": 516096, "kv_heads": 8, "layers": 126}
        (gpus / "models.json").write_text(json.dumps({LLAMA_405B: facts}))
        return {"STANDIN_GPU_DIR": str(gpus)}

    def test_each_rank_reports_the_memory_of_its_own_stage(self) -> None:
        head, tail = self.start_group(source=LLAMA_405B)

        for state in (head, tail):
            memory = state["memory"]
            # 60 GiB of weights over 2 cards a node and 2 stages: 15 GiB a card, on each node.
            assert abs(memory["weights"] - 15 * 2**30) < 0.02 * 2**30, memory
            assert sorted(memory["ranks"]) == ["0", "1"], memory  # this node's two cards
            assert "missing" not in memory, memory
        assert "sequences" in head["memory"] and "sequences" not in tail["memory"]
        assert "(Worker_PP1_TP1 pid=" in (self.tail.log_dir / "big.attempt-1.log").read_text()


class AnAgentRestart(InATemporaryDirectory):
    def test_a_headless_rank_outlives_an_agent_restart_and_is_adopted_with_its_group(self) -> None:
        port, agent_port = free_port(), free_port()
        spec = rank_spec(
            1, port=port, rendezvous=free_port(), engine="standin", env={"STANDIN_JOIN_SECONDS": "120"}
        )
        with running_agent(self.tmp_path, port=agent_port, stop_children_on_exit=False) as first:
            with first.client() as http:
                assert http.put("/v1/replicas/big", json=spec).status_code == 201
            rank = first.wait_for_state("big", "ready")
            assert first.stop() == 0
            first.known_pids.discard(rank["pid"])  # left to the next agent

        with running_agent(self.tmp_path, port=agent_port) as second, second.client() as http:
            second.known_pids.add(rank["pid"])
            adopted = second.replica("big")
            assert (adopted["state"], adopted["pid"], adopted["adopted"]) == ("ready", rank["pid"], True)
            assert adopted["group"] == spec["group"] and "known only through rank 0" in adopted["reason"]
            assert http.put("/v1/replicas/big", json=spec).status_code == 200  # the same rank: nothing new


class RankRefusals(WithAnAgent):
    """The agent refuses rank flags that the spec's group does not make, and starts nothing."""

    def refused(self, spec: dict, status: int = 400) -> dict:
        response = self.http.put("/v1/replicas/big", json=spec)
        assert response.status_code == status, response.text
        assert self.http.get("/v1/replicas").json() == [] and started_replicas(self.agent) == 0
        return response.json()

    def test_rank_flags_in_a_spec_without_a_group_are_refused(self) -> None:
        spec = rank_spec(1, port=free_port(), rendezvous=free_port())
        del spec["group"]

        body = self.refused(spec)

        assert body["code"] == "refused_arg"
        assert "--pipeline-parallel-size is refused for vllm: the launcher sets it" in body["detail"]

    def test_each_rank_flag_alone_without_a_group_is_refused(self) -> None:
        for flag, value in (
            ("--nnodes", "2"),
            ("-n", "2"),
            ("--node_rank", "1"),
            ("--master-addr", "10.0.0.9"),
        ):
            with self.subTest(flag=flag):
                body = self.refused(standin_spec(port=free_port(), args=[flag, value]))
                assert body["code"] == "refused_arg" and flag in body["detail"], body
                assert "rank flags of a replica across nodes" in body["detail"]

    def test_rank_flags_that_are_not_the_groups_are_refused(self) -> None:
        rendezvous = free_port()
        spec = rank_spec(1, port=free_port(), rendezvous=rendezvous)
        spec["group"] = {**spec["group"], "rank": 0}  # args say rank 1, the group rank 0

        body = self.refused(spec)

        assert body["code"] == "launch_mismatch"
        assert f"--node-rank 0 --master-addr 127.0.0.1 --master-port {rendezvous}" in body["detail"]

    def test_a_second_copy_of_a_rank_flag_after_the_groups_is_refused(self) -> None:
        spec = rank_spec(1, port=free_port(), rendezvous=free_port())
        spec["args"] += ["--master-addr", "10.1.2.3"]

        body = self.refused(spec)

        assert body["code"] == "refused_arg" and "--master-addr" in body["detail"]

    def test_an_engine_that_cannot_span_nodes_is_refused_with_its_reason(self) -> None:
        spec = rank_spec(0, port=free_port(), rendezvous=free_port())
        spec["engine"] = "trtllm"
        spec["args"] = standin_spec(port=spec["port"], model="big", engine="trtllm", cards=[0, 1])["args"]

        body = self.refused(spec)

        assert body["code"] == "refused_group"
        assert "trtllm cannot run a replica across nodes here" in body["detail"]
        assert "mpirun or srun" in body["detail"]

    def test_a_malformed_group_is_refused(self) -> None:
        base = standin_spec(port=free_port())
        for group, says in (
            ({"rank": 0, "size": 2, "address": "127.0.0.1"}, "exactly rank, size, address and port"),
            ({"rank": 2, "size": 2, "address": "127.0.0.1", "port": 29500}, "rank must be from 0 to 1"),
            ({"rank": 0, "size": 1, "address": "127.0.0.1", "port": 29500}, "size must be from 2"),
            ({"rank": 0, "size": 2, "address": "127.0.0.1", "port": 80}, "from 1024 to 65535"),
            ({"rank": 0, "size": 2, "address": "a b;c", "port": 29500}, "rank 0's agent host"),
            ({"rank": True, "size": 2, "address": "h", "port": 29500}, "whole numbers"),
        ):
            with self.subTest(group=group):
                body = self.refused({**base, "group": group})
                assert body["code"] == "invalid_spec" and says in body["detail"], body

    def test_rank_0s_rendezvous_port_held_by_another_program_is_refused(self) -> None:
        rendezvous = free_port()
        with socket.create_server(("127.0.0.1", rendezvous)):
            body = self.refused(rank_spec(0, port=free_port(), rendezvous=rendezvous), status=409)

        assert body["code"] == "port_busy"
        assert f"Rendezvous port {rendezvous} is in use by another program" in body["detail"]

    def test_a_headless_rank_takes_no_port_but_an_sglang_rank_takes_its_serving_port(self) -> None:
        # vLLM's --headless ranks bind nothing (rank 0 may hold the port on this very host);
        # SGLang's ranks > 0 serve a dummy health check on --port (the policy's ranks_bind_port).
        port = free_port()
        with socket.create_server(("127.0.0.1", port)):
            sglang = rank_spec(1, port=port, rendezvous=free_port(), engine="sglang")
            body = self.refused(sglang, status=409)
            vllm = self.http.put("/v1/replicas/big", json=rank_spec(1, port=port, rendezvous=free_port()))

        assert body["code"] == "port_busy" and f"Port {port} is in use by another program" in body["detail"]
        assert vllm.status_code == 201, vllm.text

    def test_a_one_node_replica_has_no_group_in_its_record(self) -> None:
        response = self.http.put("/v1/replicas/one", json=standin_spec(port=free_port()))

        assert response.status_code == 201 and "group" not in response.json()
        assert "group" not in self.agent.wait_for_state("one", "ready")


if __name__ == "__main__":
    unittest.main()
