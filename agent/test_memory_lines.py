"""The agent reads the engines' start-up memory lines, as they print them."""

from __future__ import annotations

import subprocess
import sys
import unittest
from pathlib import Path

from agent_testing import free_port
from llmgw_agent.memory_lines import (
    missing_figures,
    parse_memory_lines,
    parse_memory_ranks,
    parse_nvidia_smi_apps,
)

GIB = 2**30

# Verbatim lines from public start-up logs (the sources in tests/planning/calibration.py).
VLLM_V0 = """\
INFO 12-02 10:00:00 model_runner.py:1071] Loading model weights took 14.9888 GB
INFO 12-02 10:00:01 worker.py:232] Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.34GiB
(VllmWorkerProcess pid=2607784) INFO 01-14 12:36:52 worker.py:240] the current vLLM instance can use total_gpu_memory (23.55GiB) x gpu_memory_utilization (0.90) = 21.19GiB
INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch activation peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is -1.05GiB.
INFO 05-19 23:07:01 [executor_base.py:116] Maximum concurrency for 3072 tokens per request: 47.12x
INFO 05-19 23:07:33 [model_runner.py:1570] Graph capturing finished in 31 secs, took 0.64 GiB
"""

VLLM_V1 = """\
(Worker_TP0 pid=34322) INFO 05-06 20:59:59 [gpu_model_runner.py:4879] Model loading took 12.66 GiB memory and 31.657031 seconds
(Worker pid=63520) INFO 04-20 16:01:11 [gpu_worker.py:356] Available KV cache memory: 41.98 GiB
(EngineCore_DP0 pid=63251) INFO 04-20 16:01:11 [kv_cache_utils.py:1307] GPU KV cache size: 171,904 tokens
(EngineCore_DP0 pid=63251) INFO 04-20 16:01:11 [kv_cache_utils.py:1312] Maximum concurrency for 32,768 tokens per request: 5.25x
INFO 05-26 21:34:14 [gpu_model_runner.py:6243] Graph capturing finished in 2 secs, took 0.11 GiB
"""

SGLANG = """\
[2026-07-15 13:14:53] Load weight end. elapsed=19.09 s, type=Qwen3MoeForCausalLM, avail mem=230.20 GB, mem usage=56.98 GB.
[2026-07-15 13:14:54] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1669816, K size: 76.44 GB, V size: 76.44 GB
[2025-07-29 18:14:43 TP0] Capture cuda graph end. Time elapsed: 19.50 s. mem usage=6.19 GB. avail mem=5.24 GB.
"""


# SGLang after 0.5.10: the captured kind named, one line a kind and rank (verbatim from published
# logs: a TP 3 boot; a boot that captures prefill then decode graphs).
SGLANG_RENAMED = """\
[2026-07-21 13:35:33 TP1] Capture target decode CUDA graph end. elapsed=4.81 s, mem usage=0.27 GB, avail mem=5.34 GB.
[2026-07-21 13:35:33 TP0] Capture target decode CUDA graph end. elapsed=4.83 s, mem usage=0.24 GB, avail mem=7.28 GB.
[2026-10-10 11:59:41] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1226984, KV size: 9.21 GB
"""
SGLANG_TWO_KINDS = """\
[2026-08-27 03:46:18] Capture target prefill CUDA graph end. elapsed=22.96 s, mem usage=1.71 GB, avail mem=10.88 GB.
[2026-08-27 03:46:40] Capture target decode CUDA graph end. elapsed=18.62 s, mem usage=0.43 GB, avail mem=11.98 GB.
"""

# vLLM 0.10.2 to 0.31: the profile's breakdown line in its two spellings, the graph estimate
# (inside the budget from 0.21) and the concurrency on the tokens' line (verbatim). VLLM_CURRENT is a
# published notebook's vLLM 0.31.0 start-up (Llama-3.1-8B on an A100) whose stored copy does not name
# its repository, so it is a spelling test here and not a calibration point.
VLLM_CURRENT = """\
(EngineCore pid=326) INFO 10-06 17:00:11 [model_runner.py:407] Model loading took 15.0 GiB memory and 5.420225 seconds
(EngineCore pid=326) INFO 10-06 17:00:33 [kv_cache_utils.py:2464] GPU KV cache size: 460,496 tokens, Maximum concurrency for 131,072 tokens per request: 3.51x
(EngineCore pid=326) INFO 10-06 17:00:41 [gpu_worker.py:955] Free memory on device (78.84/79.25 GiB) on startup. Desired GPU memory utilization is (0.92, 72.91 GiB). Actual usage is 15.26 GiB for consumed memory (weights + non-torch), 1.44 GiB for peak activation, and 0.23 GiB for CUDAGraph memory.
(EngineCore pid=326) INFO 10-06 17:00:33 [gpu_worker.py:692] Available KV cache memory: 56.21 GiB
"""
VLLM_EARLIER_BREAKDOWN = """\
(EngineCore_DP0 pid=3021) INFO 09-23 18:12:39 [gpu_worker.py:391] Free memory on device (78.66/79.19 GiB) on startup. Desired GPU memory utilization is (0.9, 71.27 GiB). Actual usage is 14.08 GiB for weight, 1.97 GiB for peak activation, 0.07 GiB for non-torch memory, and 0.67 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=58333988249` to fit into requested memory.
(Worker_TP1 pid=448) INFO 08-14 14:07:22 [gpu_model_runner.py:6806] Estimated CUDA graph memory: 0.36 GiB total
"""

# llama.cpp's buffers, one line a card, older and newer spellings (verbatim).
LLAMACPP = """\
llm_load_tensors:      CUDA0 buffer size =  7043.34 MiB
llama_kv_cache_init:      CUDA0 KV buffer size =  1600.00 MiB
llama_kv_cache_init:      CUDA1 KV buffer size =  1472.00 MiB
llama_new_context_with_model:      CUDA0 compute buffer size =   368.01 MiB
"""


NVIDIA_SMI_CASES = [
    ("1234, 15000\n5678, 2000\n", {1234: 15000 * 2**20, 5678: 2000 * 2**20}),
    ("1234, 100\n1234, 200\n", {1234: 300 * 2**20}),  # one process on two cards
    ("No running processes found\n", {}),
    ("pid, used_gpu_memory [MiB]\n", {}),
]


class MemoryLinesTest(unittest.TestCase):
    """Each engine's memory lines, read as the agent reads them (standard library only)."""

    def test_vllm_v0_lines_give_each_term(self):
        got = parse_memory_lines(VLLM_V0.splitlines())
        assert got["weights"] == round(5.20 * GIB)  # the breakdown line, after the loading line
        assert got["non_torch"] == round(0.03 * GIB)
        assert got["activation"] == round(1.42 * GIB)
        assert got["kv_cache"] == round(-1.05 * GIB)
        assert (got["total"], got["fraction"], got["budget"]) == (
            round(23.55 * GIB),
            0.90,
            round(21.19 * GIB),
        )
        assert (got["context"], got["sequences"]) == (3072, 47.12)
        assert got["cuda_graph"] == round(0.64 * GIB)

    def test_vllm_v1_lines_give_weights_cache_tokens_and_graphs(self):
        got = parse_memory_lines(VLLM_V1.splitlines())
        assert got == {
            "weights": round(12.66 * GIB),
            "kv_cache": round(41.98 * GIB),
            "kv_tokens": 171904,
            "context": 32768,
            "sequences": 5.25,
            "cuda_graph": round(0.11 * GIB),
        }

    def test_sglang_lines_give_weights_the_pool_and_graphs(self):
        got = parse_memory_lines(SGLANG.splitlines())
        assert got == {
            "weights": round(56.98 * GIB),
            "kv_tokens": 1669816,
            "kv_cache": round((76.44 + 76.44) * GIB),
            "cuda_graph": round(6.19 * GIB),
        }

    def test_sglang_after_0_5_10_names_its_graphs_and_they_sum_per_rank(self):
        ranks = parse_memory_ranks(SGLANG_RENAMED.splitlines())
        assert ranks[1]["cuda_graph"] == round(0.27 * GIB)
        assert ranks[0]["cuda_graph"] == round(0.24 * GIB)
        assert (ranks[0]["kv_tokens"], ranks[0]["kv_cache"]) == (1226984, round(9.21 * GIB))
        got = parse_memory_lines(SGLANG_TWO_KINDS.splitlines())
        assert got["cuda_graph"] == round(1.71 * GIB) + round(0.43 * GIB)

    def test_current_vllm_lines_give_the_profile_and_the_graphs(self):
        got = parse_memory_lines(VLLM_CURRENT.splitlines())
        assert got["weights"] == round(15.0 * GIB)
        assert got["non_torch"] == round(15.26 * GIB) - round(15.0 * GIB)  # consumed less the weights
        assert got["activation"] == round(1.44 * GIB) and got["cuda_graph"] == round(0.23 * GIB)
        assert (got["total"], got["fraction"], got["budget"]) == (
            round(79.25 * GIB),
            0.92,
            round(72.91 * GIB),
        )
        assert (got["kv_tokens"], got["context"], got["sequences"]) == (460496, 131072, 3.51)
        assert got["kv_cache"] == round(56.21 * GIB)
        earlier = parse_memory_ranks(VLLM_EARLIER_BREAKDOWN.splitlines())
        assert earlier[0]["weights"] == round(14.08 * GIB) and earlier[0]["non_torch"] == round(0.07 * GIB)
        assert earlier[1] == {"cuda_graph_estimate": round(0.36 * GIB)}

    def test_llamacpp_buffers_are_read_card_by_card(self):
        ranks = parse_memory_ranks(LLAMACPP.splitlines())
        assert ranks[0] == {
            "weights": round(7043.34 * 2**20),
            "kv_cache": round(1600 * 2**20),
            "activation": round(368.01 * 2**20),
        }
        assert ranks[1] == {"kv_cache": round(1472 * 2**20)}
        assert missing_figures("llamacpp", ranks[1]) == ["weights"]

    def test_a_log_without_memory_lines_gives_nothing(self):
        assert parse_memory_lines(["INFO starting", "Uvicorn running on http://0.0.0.0:8000"]) == {}

    def test_nvidia_smi_compute_apps(self):
        for text, expected in NVIDIA_SMI_CASES:
            with self.subTest(text=text):
                assert parse_nvidia_smi_apps(text) == expected

    def test_the_standin_engine_prints_lines_the_agent_reads_back(self):
        env = {
            "STANDIN_MEMORY": "weights=14.96,non_torch=0.35,activation=1.26,kv_cache=53.29,cuda_graph=0.64,"
            "total=79.22,fraction=0.9,context=8192,sequences=13.3",
            "STANDIN_EXIT_AT_START": "",
            "PATH": "/usr/bin:/bin",
        }
        standin = Path(__file__).resolve().parent.parent / "agent" / "standin_engine.py"
        proc = subprocess.Popen(
            [sys.executable, str(standin), "--port", str(free_port()), "--load-seconds", "0"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = []
        try:
            for line in proc.stderr:  # until it listens: the memory lines come before
                lines.append(line)
                if "listening on" in line:
                    break
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            proc.stderr.close()
        got = parse_memory_lines(lines)
        assert got["weights"] == round(14.96 * GIB) and got["activation"] == round(1.26 * GIB)
        assert got["kv_cache"] == round(53.29 * GIB) and got["cuda_graph"] == round(0.64 * GIB)
        assert (got["context"], got["sequences"], got["fraction"]) == (8192, 13.3, 0.9)


if __name__ == "__main__":
    unittest.main()
