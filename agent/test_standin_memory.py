"""The stand-in engine prints the start-up memory lines of the engine and release it plays, with
figures that follow that engine's accounting, and holds that memory in the stand-in nvidia-smi;
the agent reads both back as it reads a real engine's (standard library only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import standin_memory
from agent_testing import free_port
from llmgw_agent.memory_lines import (
    missing_figures,
    parse_memory_lines,
    parse_memory_ranks,
    parse_nvidia_smi_apps,
)

GIB = 2**30
AGENT = Path(__file__).resolve().parent
H100_MIB = 81559
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
FACTS = {
    LLAMA: {
        "weight_bytes": 16060522496,
        "kv_bytes_per_token": 131072,
        "kv_heads": 8,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "layers": 32,
        "context_length": 131072,
    }
}


class StandinMemoryTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="standin-gpus-"))
        cards = [{"index": i, "name": "h100-80g", "memory_mib": H100_MIB} for i in range(4)]
        (self.dir / "cards.json").write_text(json.dumps(cards))
        (self.dir / "models.json").write_text(json.dumps(FACTS))
        self.env = {"STANDIN_GPU_DIR": str(self.dir), "CUDA_VISIBLE_DEVICES": "1,2"}

    def play(self, engine: str, release: str, args: list[str]) -> standin_memory.Startup:
        with mock.patch.dict(os.environ, self.env):
            return standin_memory.startup(engine, release, args, 4242)

    def test_vllm_takes_its_fraction_and_the_cache_is_what_the_budget_leaves(self):
        total = H100_MIB / 1024
        for release, graphs_inside in (("0.19.0", False), ("0.21.0", True)):
            with self.subTest(release=release):
                played = self.play(
                    "vllm", release, [LLAMA, "--max-model-len", "8192", "--tensor-parallel-size", "2"]
                )
                got = parse_memory_lines(played.lines)
                budget = 0.9 * total * GIB
                inside = got["weights"] + got["activation"] + got["non_torch"] + got["kv_cache"]
                if graphs_inside:
                    inside += got["cuda_graph"]
                    assert got["cuda_graph_estimate"] == got["cuda_graph"]
                else:
                    assert "cuda_graph_estimate" not in got
                assert abs(inside - budget) < 0.05 * GIB, (inside / GIB, budget / GIB)
                assert got["weights"] == round(7.48 * GIB)  # 16.06 GB over TP 2, as logged (2 decimals)
                # the tokens are the cache over a token's bytes on a card (8 KV heads over 2 cards)
                assert abs(got["kv_tokens"] - got["kv_cache"] / (131072 / 2)) < 2000
                assert got["sequences"] == round(got["kv_tokens"] / 8192, 2)
                assert set(parse_memory_ranks(played.lines)) == {0, 1}
                assert missing_figures("vllm", got) == []
                # nvidia-smi: the budget less the activation peak (freed after the profile), the graphs
                # where they are beside the budget, and the CUDA context, on each of its cards
                held = (
                    0.9 * total - got["activation"] / GIB + (0 if graphs_inside else got["cuda_graph"] / GIB)
                )
                assert set(played.held_mib) == {1, 2}
                assert abs(played.held_mib[1] / 1024 - (held + standin_memory.CONTEXT_GIB)) < 0.01

    def test_vllm_with_a_pinned_pool_takes_what_it_needs(self):
        args = [LLAMA, "--tensor-parallel-size", "2", "--kv-cache-memory-bytes", str(20 * GIB)]
        played = self.play("vllm", "0.19.0", args)
        got = parse_memory_lines(played.lines)
        assert got["kv_cache"] == 20 * GIB
        assert played.held_mib[1] < 0.5 * H100_MIB

    def test_an_old_vllm_prints_v0s_lines(self):
        got = parse_memory_lines(self.play("vllm", "0.8.5", [LLAMA, "--max-model-len", "8192"]).lines)
        assert {"weights", "non_torch", "activation", "kv_cache", "total", "fraction", "budget"} <= set(got)

    def test_sglang_takes_its_fraction_and_names_its_graphs_as_its_release_does(self):
        for release, spelling in (
            ("0.5.10", "Capture cuda graph end."),
            ("0.5.11", "Capture target decode CUDA graph end."),
        ):
            with self.subTest(release=release):
                played = self.play("sglang", release, ["--model-path", LLAMA, "--tp-size", "2"])
                assert sum(spelling in line for line in played.lines) == 2  # one a rank
                got = parse_memory_lines(played.lines)
                fraction = standin_memory.sglang_fraction(H100_MIB / 1024, 2)
                pool = fraction * H100_MIB / 1024 * GIB
                assert abs(got["weights"] + got["kv_cache"] - pool) < 0.02 * GIB
                assert got["cuda_graph"] == round(0.45 * GIB)
                assert missing_figures("sglang", got) == []
                assert set(parse_memory_ranks(played.lines)) == {0, 1}
                assert played.held_mib[1] > fraction * H100_MIB

    def test_llamacpp_holds_what_it_needs_card_by_card(self):
        played = self.play("llamacpp", "b6500", ["-m", LLAMA, "--ctx-size", "8192"])
        ranks = parse_memory_ranks(played.lines)
        assert ranks[0]["weights"] == ranks[1]["weights"] == round(16060522496 / 2 / 2**20, 2) * 2**20
        assert ranks[0]["kv_cache"] == 8192 * 131072 // 2
        assert ranks[0]["kv_tokens"] == 8192
        needs = (ranks[1]["weights"] + ranks[1]["kv_cache"] + ranks[1]["activation"]) / 2**20
        assert abs(played.held_mib[2] - (needs + standin_memory.CONTEXT_GIB * 1024)) <= 1
        assert played.held_mib[2] < 0.25 * H100_MIB  # not the 90% a vLLM replica takes

    def test_a_pipeline_stage_of_a_replica_across_nodes_holds_its_share_per_card(self):
        one_node = self.play("vllm", "0.19.0", [LLAMA, "--tensor-parallel-size", "2"])
        rank_flags = ["--pipeline-parallel-size", "2", "--nnodes", "2", "--master-addr", "gpu-a"]
        head = self.play(
            "vllm", "0.19.0", [LLAMA, "--tensor-parallel-size", "2", *rank_flags, "--node-rank", "0"]
        )
        tail = self.play(
            "vllm",
            "0.19.0",
            [LLAMA, "--tensor-parallel-size", "2", *rank_flags, "--node-rank", "1", "--headless"],
        )

        whole = parse_memory_lines(one_node.lines)["weights"]
        for played, stage in ((head, 0), (tail, 1)):
            ranks = parse_memory_ranks(played.lines)
            assert sorted(ranks) == [0, 1], ranks  # this node's two cards, named by their TP rank
            assert all(abs(r["weights"] - whole / 2) <= 0.01 * GIB for r in ranks.values())
            assert any(f"(Worker_PP{stage}_TP1 pid=4242)" in line for line in played.lines)
        # The engine core, which sizes the KV cache for the whole group, runs on rank 0 alone.
        head_got, tail_got = parse_memory_lines(head.lines), parse_memory_lines(tail.lines)
        assert "sequences" in head_got and "sequences" not in tail_got
        assert missing_figures("vllm", tail_got, ["--headless"]) == []
        assert missing_figures("vllm", tail_got) == ["sequences"]
        # Half the layers a card: twice the tokens of KV cache in the same pool, and more pool.
        assert head_got["kv_tokens"] > 2 * parse_memory_lines(one_node.lines)["kv_tokens"]

    def test_without_the_model_or_the_cards_it_plays_nothing(self):
        assert self.play("vllm", "0.19.0", ["some/other-model"]).lines == []
        with mock.patch.dict(os.environ, {**self.env, "CUDA_VISIBLE_DEVICES": ""}):
            assert standin_memory.startup("vllm", "0.19.0", [LLAMA], 1).held_mib == {}

    def test_a_missing_expected_line_is_reported_not_guessed(self):
        played = self.play(
            "vllm", "0.19.0", [LLAMA, "--max-model-len", "8192", "--tensor-parallel-size", "2"]
        )
        dropped = ("Maximum concurrency", "Graph capturing", "CUDAGraph memory")
        lines = [line for line in played.lines if not any(d in line for d in dropped)]
        got = parse_memory_lines(lines)
        assert missing_figures("vllm", got) == ["sequences", "cuda_graph"]
        assert missing_figures("vllm", got, ["--enforce-eager"]) == ["sequences"]
        assert "sequences" not in got

    def test_the_running_standin_and_its_nvidia_smi_agree(self):
        env = {**os.environ, **self.env, "PATH": "/usr/bin:/bin"}
        env.pop("STANDIN_MEMORY", None)
        proc = subprocess.Popen(
            [
                sys.executable,
                str(AGENT / "standin_engine.py"),
                "--port",
                str(free_port()),
                "--load-seconds",
                "0",
                "--play",
                "sglang",
                "--play-release",
                "0.5.11",
                "--model-path",
                LLAMA,
                "--tp-size",
                "2",
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = []
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                if "listening on" in line:
                    break
            smi = subprocess.run(
                [
                    sys.executable,
                    str(AGENT / "standin_nvidia_smi.py"),
                    "--query-compute-apps=pid,used_memory",
                    "--format=csv,noheader,nounits",
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            if proc.stderr is not None:
                proc.stderr.close()
        held = parse_nvidia_smi_apps(smi)[proc.pid]
        with mock.patch.dict(os.environ, self.env):
            expected = standin_memory.startup(
                "sglang", "0.5.11", ["--model-path", LLAMA, "--tp-size", "2"], 1
            )
        assert held == sum(expected.held_mib.values()) * 2**20
        assert parse_memory_lines(lines)["kv_tokens"] > 0


if __name__ == "__main__":
    unittest.main()
