"""vLLM's fused-MoE workspaces in the activation term, and the per-layer CUDA graph term of vLLM 0.17 to 0.20
(planning/engines.toml sources.activation and sources.cuda_graph say where each comes from)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planning.engines import terms_for
from planning.memory import FP32, MODEL_DTYPE, moe_forward, overhead_terms
from tests.planning.calibration_logged import GIB
from tests.planning.calibration_shapes import shape_from_fixture

MIXTRAL = shape_from_fixture("mistralai__Mixtral-8x7B-v0.1", round(43.51 * 2 * GIB))
QWEN3_30B = shape_from_fixture("Qwen__Qwen3-30B-A3B", round(56.88 * GIB))
H100 = round(79.19 * GIB)


def _activation(release: str, shape, tp: int, args=()) -> float:
    terms = overhead_terms(
        terms_for("vllm", release), shape, tp, args=args, total=H100, class_name="H100 80GB"
    )
    return next(t.bytes for t in terms if t.name == "activation") / GIB


def test_the_moe_workspaces_are_the_kernels_shapes_a_batch_token():
    # Mixtral at TP 2: 2 experts a token of 14336 / 2 = 7168 a card, hidden 4096:
    # 2 x (max(7168, 4096) + max(14336, 4096)) + 4096 = 47104 model-dtype values a token.
    mem = terms_for("vllm", "0.19.0").memory
    moe = moe_forward(mem, MIXTRAL, 2, 8192)
    assert moe is not None
    assert moe[0] == 2 * (7168 + 14336) + 4096
    assert "2 experts a token" in moe[1]


def test_the_sampler_peaks_on_top_of_the_kept_workspaces_as_logged_under_0_19():
    # llm-d-incubation/llm-d-planner accuracy/results/v0.19.0 (H100, 8192 batch tokens, 1024 sequences):
    # Mixtral-8x7B at TP 2 'torch peak memory increase: 1.21GiB'; Qwen3-30B-A3B 2.68.
    sampler = 4 * 1024 * MIXTRAL.vocab_size * FP32 / GIB
    workspaces = 8192 * MODEL_DTYPE * (2 * (7168 + 14336) + 4096) / GIB
    assert _activation("0.19.0", MIXTRAL, 2) == pytest.approx(sampler + workspaces, abs=1e-6)
    assert _activation("0.19.0", MIXTRAL, 2) == pytest.approx(1.21, abs=0.01)
    assert 2.68 <= _activation("0.19.0", QWEN3_30B, 1) <= 2.68 * 1.1
    # without the experts-per-token figure the same model plans the sampler alone, under the log
    assert _activation("0.19.0", replace(QWEN3_30B, experts_per_token=None), 1) < 2.68


def test_the_workspaces_follow_the_batch_and_stop_at_the_kernels_chunk():
    mem = terms_for("vllm", "0.31.0").memory
    small, large = moe_forward(mem, QWEN3_30B, 1, 2048), moe_forward(mem, QWEN3_30B, 1, 65536)
    assert small is not None and large is not None
    assert large[0] == pytest.approx(small[0] * mem.activation_moe_chunk / 65536)
    assert "chunks of 32768" in large[1]


def test_older_releases_and_dense_models_keep_the_dense_formula():
    assert moe_forward(terms_for("vllm", "0.12").memory, QWEN3_30B, 1, 8192) is None
    dense = replace(QWEN3_30B, experts_per_token=None, expert_intermediate_size=None)
    assert moe_forward(terms_for("vllm", "0.19.0").memory, dense, 1, 8192) is None


def test_graphs_under_0_17_to_0_20_grow_with_the_layers_and_go_with_an_eager_flag():
    eng = terms_for("vllm", "0.19.0")
    graphs = next(t for t in overhead_terms(eng, QWEN3_30B, 1, total=H100) if t.name == "cuda_graph")
    # 0.45 GiB + 0.0175 GiB x 48 layers; logged 1.41 GiB for this model under 0.19.0
    assert graphs.bytes / GIB == pytest.approx(0.45 + 0.0175 * 48, abs=1e-6)
    assert "48 layers" in graphs.how and not graphs.inside
    eager = overhead_terms(eng, QWEN3_30B, 1, total=H100, args=("--enforce-eager",))
    assert "cuda_graph" not in {t.name for t in eager}
