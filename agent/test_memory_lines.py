"""The agent reads the engines' start-up memory lines, as they print them."""

from __future__ import annotations

import subprocess
import sys
import unittest
from pathlib import Path

from agent_testing import free_port
from llmgw_agent.memory_lines import parse_memory_lines, parse_nvidia_smi_apps

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
