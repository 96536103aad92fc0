"""What each card holds, worked out by hand from the models' config.json.

Figures come from /work/shared/fixtures/hf-configs (config.json and the
safetensors index's total_size); each test writes out its arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planning.engines import engine, terms_for
from planning.memory import card_memory, kv_cache_bytes, kv_per_card
from planning.types import Shape

GIB = 2**30
# vLLM's terms from the registry (engines.toml [vllm.memory], each with its
# source): outside PyTorch 0.35 GiB, communication buffers 1.8 GiB at TP > 1,
# CUDA graphs 1 GiB; the sampler's peak is 4 copies of max_num_seqs x
# vocabulary fp32 logits (256 sequences on a card of unknown size; from vLLM
# 0.17 top-k/top-p is masked in place, no sort).
NON_TORCH = round(0.35 * GIB)
COMM = round(1.8 * GIB)
GRAPHS = GIB
LLAMA_SAMPLER = 4 * 256 * 128256 * 4
assert LLAMA_SAMPLER == 525336576
VLLM_TP1 = LLAMA_SAMPLER + NON_TORCH + GRAPHS
VLLM_OVERHEAD = LLAMA_SAMPLER + NON_TORCH + COMM + GRAPHS  # TP > 1
# llama.cpp's compute buffer for a 512-token ubatch (engines.toml [llamacpp.memory] compute_buffer): the
# output phase, 512 x 128256 fp32 logits beside two hidden (4096) rows and one FFN (14336) row a token.
LLAMACPP_OVERHEAD = 4 * 512 * 128256 + 4 * 512 * (2 * 4096 + 14336)
FREETOKEN_OVERHEAD = GIB

# meta-llama/Llama-3.1-8B: 32 layers, 32 attention heads, 8 KV heads, head_dim
# 4096 / 32 = 128, bfloat16. K and V for every layer and KV head, 2 bytes each:
LLAMA_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2
assert LLAMA_KV_PER_TOKEN == 131072
LLAMA_WEIGHTS = 16060522496  # total_size, quoted
LLAMA = Shape(
    layers=32,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=LLAMA_KV_PER_TOKEN,
    weight_bytes=LLAMA_WEIGHTS,
    context_length=131072,
    hidden_size=4096,
    intermediate_size=14336,
    vocab_size=128256,
)


def test_gqa_on_fewer_cards_than_kv_heads_splits_the_cache_by_card():
    # 8192 tokens: 131072 × 8192 = 1 GiB of cache for the whole model; on 4
    # cards each keeps 2 of the 8 KV heads, a quarter of it.
    memory = card_memory(engine("vllm"), LLAMA, 4, 8192, 72 * GIB)
    kv_total = 131072 * 8192
    assert kv_total == GIB
    assert (memory.cards, memory.weights, memory.kv, memory.context) == (
        4,
        16060522496 // 4,  # 4015130624, exact
        kv_total // 4,  # 268435456
        8192,
    )
    assert [t.name for t in memory.terms] == ["activation", "non_torch", "comm_buffers", "cuda_graph"]
    assert memory.overhead == VLLM_OVERHEAD
    assert memory.need == 4015130624 + 268435456 + VLLM_OVERHEAD  # 8.36 GiB
    assert memory.budget == 72 * GIB
    assert memory.fits
    assert memory.per_card == "7.6 GiB on each of 4 cards, of 72 GiB usable on each"


def test_gqa_on_more_cards_than_kv_heads_keeps_one_head_a_card():
    # 16 cards, 8 KV heads: cards pair up on a head, so each keeps 1/8 of the
    # cache, not 1/16. The weights still split 16 ways.
    memory = card_memory(engine("vllm"), LLAMA, 16, 8192, 72 * GIB)
    assert memory.kv == GIB // 8  # 134217728, not GIB // 16
    assert memory.weights == 16060522496 // 16  # 1003782656, exact
    assert memory.need == 1003782656 + 134217728 + VLLM_OVERHEAD


def test_the_full_context_of_llama_on_one_card():
    # 131072 tokens × 131072 bytes = 16 GiB of cache on one card, plus all
    # 16060522496 bytes of weights and the overhead: 32.46 GiB.
    memory = card_memory(engine("vllm"), LLAMA, 1, 131072, 24 * GIB)
    assert memory.kv == 16 * GIB
    assert memory.need == 16060522496 + 16 * GIB + VLLM_TP1  # no communication buffers at TP 1
    assert not memory.fits
    assert memory.per_card == "32.8 GiB on its 1 card, of 24 GiB usable"


# deepseek-ai/DeepSeek-V3: 61 layers, MLA with kv_lora_rank 512 and
# qk_rope_head_dim 64: one latent of 512 + 64 = 576 values a layer a token,
# 2 bytes each (bf16 cache).
DEEPSEEK_KV_PER_TOKEN = 61 * (512 + 64) * 2
assert DEEPSEEK_KV_PER_TOKEN == 70272
DEEPSEEK_WEIGHTS = 688586727753  # its files' sizes summed (headers included): close enough to plan with
DEEPSEEK = Shape(
    layers=61,
    attention_heads=128,
    kv_heads=128,
    attention="mla",
    kv_bytes_per_token=DEEPSEEK_KV_PER_TOKEN,
    weight_bytes=DEEPSEEK_WEIGHTS,
    context_length=163840,
)


@pytest.mark.parametrize("n", [8, 16, 32])
def test_an_mla_cache_is_whole_on_every_card(n):
    # 32768 tokens × 70272 bytes = 2302672896 bytes (2.14 GiB), on each card
    # whatever the count; only the weights shrink.
    memory = card_memory(engine("sglang"), DEEPSEEK, n, 32768, 141 * GIB)
    assert memory.kv == 70272 * 32768 == 2302672896
    assert memory.weights == -(-688586727753 // n)  # rounded up to whole bytes
    # SGLang's static pool is weights and KV cache; beside them, what the card
    # held before the weights loaded (0.70 GiB, and 2.0 GiB of torch distributed
    # init at TP > 1 on a card whose size is unknown). With the card's total
    # unknown, the budget is the class's usable memory.
    held = round(0.70 * GIB) + round(2.0 * GIB)
    assert [t.name for t in memory.terms] == ["non_torch", "comm_buffers"]
    assert memory.need == memory.weights + 2302672896 + held


def test_llamacpp_splits_layers_so_the_cache_splits_by_card():
    # A llama.cpp profile of the same 8B model: say a 4920739232-byte GGUF.
    # 16384 tokens × 131072 = 2 GiB of cache; each of 2 cards keeps half the
    # layers, so half the cache and half the weights, and llama.cpp's compute buffer on each (0.29 GiB).
    gguf = replace(LLAMA, weight_bytes=4920739232)
    memory = card_memory(engine("llamacpp"), gguf, 2, 16384, 24 * GIB)
    assert memory.weights == 4920739232 // 2  # 2460369616
    assert memory.kv == 2 * GIB // 2  # 1073741824: 16384 is a whole number of 256-cell blocks
    assert memory.overhead == LLAMACPP_OVERHEAD
    assert memory.need == 2460369616 + 1073741824 + LLAMACPP_OVERHEAD


def test_llamacpp_splits_even_an_mla_cache_by_layers():
    memory = card_memory(engine("llamacpp"), DEEPSEEK, 4, 32768, None)
    assert memory.kv == 2302672896 // 4


# Qwen/Qwen3-30B-A3B: 48 layers, 4 KV heads, head_dim 128, bf16; 128 experts a
# layer, each gate, up and down of 2048 × 768.
QWEN_MOE_KV_PER_TOKEN = 2 * 48 * 4 * 128 * 2
assert QWEN_MOE_KV_PER_TOKEN == 98304
QWEN_MOE_EXPERTS = 3 * 2048 * 768 * 2 * 128 * 48
assert QWEN_MOE_EXPERTS == 57982058496
QWEN_MOE = Shape(
    layers=48,
    attention_heads=32,
    kv_heads=4,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=QWEN_MOE_KV_PER_TOKEN,
    weight_bytes=61064245248,  # total_size, quoted
    expert_bytes=QWEN_MOE_EXPERTS,
    context_length=40960,
)


def test_freetoken_keeps_the_experts_off_the_card():
    # 61064245248 − 57982058496 = 3082186752 bytes stay on the card; 40960
    # tokens × 98304 = 4026531840 bytes of cache; FreeToken's 1 GiB.
    memory = card_memory(engine("freetoken"), QWEN_MOE, 1, 40960, 22 * GIB)
    assert memory.weights == 61064245248 - 57982058496 == 3082186752
    assert memory.kv == 98304 * 40960 == 4026531840
    assert memory.need == 3082186752 + 4026531840 + FREETOKEN_OVERHEAD  # 7.62 GiB
    assert memory.fits


def test_an_engine_that_keeps_experts_on_cards_holds_all_the_weights():
    memory = card_memory(engine("vllm"), QWEN_MOE, 4, 40960, None)
    assert memory.weights == 61064245248 // 4  # 15266061312, exact
    assert memory.kv == 4026531840 // 4  # 4 cards, 4 KV heads: a head each


# openai/gpt-oss-20b: 24 layers alternating sliding (window 128) and full
# attention; 8 KV heads, head_dim 64, bf16 cache.
GPT_OSS = Shape(
    layers=24,
    attention_heads=64,
    kv_heads=8,
    head_dim=64,
    attention="gqa",
    kv_bytes_per_token=2 * 24 * 8 * 64 * 2,  # 49152, as if every layer kept every token
    weight_bytes=13761264768,
    sliding_window=128,
    sliding_layers=12,
)


def test_sliding_window_layers_keep_only_the_window():
    # 8192 tokens: 12 full layers keep 8192, 12 sliding ones keep 128.
    # 49152 bytes a token over 24 layers is 2048 a layer a token:
    # 2048 × (12 × 8192 + 12 × 128) = 204472320.
    assert kv_cache_bytes(GPT_OSS, 8192) == 2048 * (12 * 8192 + 12 * 128) == 204472320
    # Shorter than the window, every layer keeps every token.
    assert kv_cache_bytes(GPT_OSS, 100) == 49152 * 100


@pytest.mark.parametrize(
    ("shape", "context"),
    [
        (None, 8192),
        (Shape(kv_bytes_per_token=131072), 8192),  # weights unknown
        (Shape(weight_bytes=16060522496), 8192),  # KV per token unknown
        (LLAMA, None),  # context unknown
        (LLAMA, 0),
    ],
)
def test_card_memory_is_none_when_a_figure_is_unknown(shape, context):
    assert card_memory(engine("vllm"), shape, 4, context, 72 * GIB) is None


def test_without_a_budget_it_fits_and_says_no_budget():
    memory = card_memory(engine("vllm"), LLAMA, 4, 8192, None)
    assert memory.fits
    assert memory.per_card == "7.6 GiB on each of 4 cards"


def test_the_cache_splits_over_every_card_when_kv_heads_are_unknown():
    shape = Shape(kv_bytes_per_token=131072, weight_bytes=16060522496)
    assert card_memory(engine("vllm"), shape, 16, 8192, None).kv == GIB // 16


def test_mqa_keeps_the_whole_cache_on_each_card():
    shape = Shape(
        kv_heads=1, attention_heads=32, kv_bytes_per_token=4096, weight_bytes=10**9, attention="mqa"
    )
    # vLLM allocates whole blocks of 16 tokens: 1000 tokens take 63 blocks, 1008.
    assert card_memory(engine("vllm"), shape, 8, 1000, None).kv == 4096 * 1008


# -- each term against the engines' own figures --------------------------------

H100 = 80 * GIB  # total memory a card
VLLM_GPT_OSS = replace(GPT_OSS, hidden_size=2880, intermediate_size=11520, vocab_size=201088)


def test_vllm_keeps_window_minus_one_plus_the_batch_for_a_sliding_layer():
    # vllm/v1/kv_cache_interface.py SlidingWindowSpec: min(128 - 1 + 8192,
    # 8192) = 8192 tokens, in blocks of 16, plus one block: 8208 tokens. At
    # an 8K context the sliding layers keep nearly all of it, not 128.
    memory = card_memory(engine("vllm"), VLLM_GPT_OSS, 1, 8192, 72 * GIB, total=H100)
    per_layer = 49152 // 24
    assert memory.kv == per_layer * (12 * 8192 + 12 * 8208)
    # At 32K the window plus a batch is less than the context: 8192 + 127 =
    # 8319 tokens, 520 blocks, plus one: 8336.
    memory = card_memory(engine("vllm"), VLLM_GPT_OSS, 1, 32768, 72 * GIB, total=H100)
    assert memory.kv == per_layer * (12 * 32768 + 12 * 8336)


def test_a_smaller_batch_shrinks_what_a_sliding_layer_keeps():
    args = ("--max-num-batched-tokens", "2048")
    memory = card_memory(engine("vllm"), VLLM_GPT_OSS, 1, 32768, 72 * GIB, total=H100, args=args)
    # min(127 + 2048, 32768) = 2175 → 136 blocks + 1 = 137 blocks, 2192 tokens.
    assert memory.kv == 2048 * (12 * 32768 + 12 * 2192)


@pytest.mark.parametrize(
    ("full", "sliding", "slots"),
    [
        (12, 12, (12, 12)),  # gpt-oss-20b: one group of each, nothing padded
        (4, 22, (4, 24)),  # gemma-3-1b: groups of 4, 2 padding sliding layers
        (10, 52, (10, 60)),  # gemma-3-27b: groups of 10, 8 padding
        (13, 12, (13, 13)),  # below 1.5 x the smaller: groups of the larger count
    ],
)
def test_vllm_groups_a_hybrid_models_layers_and_pads_the_last_group(full, sliding, slots):
    # vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size:
    # the padding layers hold cache like the real ones.
    shape = Shape(
        layers=full + sliding,
        kv_heads=1,
        kv_bytes_per_token=1024 * (full + sliding),
        sliding_window=128,
        sliding_layers=sliding,
    )
    vllm = kv_per_card(engine("vllm"), shape, 1, 32768, batch=2048)
    assert vllm is not None and vllm[0] == 1024 * (slots[0] * 32768 + slots[1] * 2192)
    # SGLang keeps sliding layers whole and groups nothing
    sglang = kv_per_card(engine("sglang"), shape, 1, 32768)
    assert sglang is not None and sglang[0] == 1024 * (full + sliding) * 32768


def test_an_fp8_cache_takes_half():
    fp8 = card_memory(engine("vllm"), LLAMA, 1, 8192, None, args=("--kv-cache-dtype", "fp8"))
    assert fp8.kv == GIB // 2


def test_vllm_budget_is_its_utilisation_of_the_card_capped_by_the_class():
    # determine_available_memory: total x gpu_memory_utilization (0.9 by default).
    memory = card_memory(engine("vllm"), LLAMA, 1, 8192, 76 * GIB, total=H100)
    assert memory.budget == int(H100 * 0.92) == memory.engine_budget  # 0.92 by default from vllm#38284
    assert "0.9" in memory.budget_how
    lower = card_memory(
        engine("vllm"), LLAMA, 1, 8192, 76 * GIB, total=H100, args=("--gpu-memory-utilization=0.5",)
    )
    assert lower.budget == 40 * GIB
    # The class's usable memory caps it.
    capped = card_memory(engine("vllm"), LLAMA, 1, 8192, 60 * GIB, total=H100)
    assert capped.budget == 60 * GIB and "capped" in capped.budget_how


def test_large_cards_take_vllms_larger_batch_defaults():
    # arg_utils.get_batch_defaults: 8192 batch tokens and 1024 sequences on a
    # card of 70 GiB or more that is not an A100, else 2048 and 256 (vLLM 0.20
    # and earlier, here 0.19's terms). From 0.21 the A100 takes the large ones
    # too: the one A100 start-up of that range logs a peak 256 sequences cannot
    # reach (engines.toml, [vllm.memory.sources] activation).
    older = terms_for("vllm", "0.19.1")
    h100 = card_memory(older, LLAMA, 1, 8192, 76 * GIB, total=H100, class_name="h100-80g")
    a100 = card_memory(older, LLAMA, 1, 8192, 76 * GIB, total=H100, class_name="a100-80g")
    (act_h100,) = [t for t in h100.terms if t.name == "activation"]
    (act_a100,) = [t for t in a100.terms if t.name == "activation"]
    assert act_h100.bytes == 4 * 1024 * 128256 * 4  # the sampler over 1024 sequences
    assert act_a100.bytes == LLAMA_SAMPLER
    current = card_memory(engine("vllm"), LLAMA, 1, 8192, 76 * GIB, total=H100, class_name="a100-80g")
    (act_current,) = [t for t in current.terms if t.name == "activation"]
    assert act_current.bytes == act_h100.bytes
    # under 70 GiB the small defaults hold for every release
    small = card_memory(engine("vllm"), LLAMA, 1, 8192, 40 * GIB, total=44 * GIB, class_name="l40s")
    (act_small,) = [t for t in small.terms if t.name == "activation"]
    assert act_small.bytes == LLAMA_SAMPLER


def test_a_long_batch_makes_the_forward_pass_the_peak():
    # 20000 batch tokens x 2 bytes x (3 x 14336 + 3 x 4096) = 2.06 GiB, above
    # the sampler's 0.49 GiB.
    memory = card_memory(engine("vllm"), LLAMA, 1, 20000, None, args=("--max-num-batched-tokens", "20000"))
    (act,) = [t for t in memory.terms if t.name == "activation"]
    assert act.bytes == 20000 * 2 * (3 * 14336 + 3 * 4096)
    assert act.how.startswith("forward pass")


def test_at_tp_above_one_the_forward_pass_holds_the_all_reduce_output_too():
    # vLLM's CudaCommunicator.all_reduce returns a new tensor, so each
    # row-parallel layer's partial output and its sum are alive together:
    # one more hidden-sized copy a batch token at TP > 1, none at TP 1.
    args = ("--max-num-batched-tokens", "20000")
    tp1 = card_memory(engine("vllm"), LLAMA, 1, 20000, None, args=args)
    tp2 = card_memory(engine("vllm"), LLAMA, 2, 20000, None, args=args)
    (act1,) = [t for t in tp1.terms if t.name == "activation"]
    (act2,) = [t for t in tp2.terms if t.name == "activation"]
    assert act1.bytes == 20000 * 2 * (3 * 14336 + 3 * 4096)
    assert act2.bytes == 20000 * 2 * (3 * 14336 // 2 + 4 * 4096)
    assert "4 x 4096" in act2.how


def test_enforce_eager_drops_the_cuda_graphs():
    memory = card_memory(engine("vllm"), LLAMA, 2, 8192, None, args=("--enforce-eager",))
    assert "cuda_graph" not in [t.name for t in memory.terms]
    assert "comm_buffers" in [t.name for t in memory.terms]


def test_replicated_weights_are_whole_on_every_card():
    shape = replace(LLAMA, replicated_bytes=10**8)
    memory = card_memory(engine("vllm"), shape, 4, 8192, None)
    assert memory.weights == -(-(16060522496 - 10**8) // 4) + 10**8


def test_sglang_default_fraction_follows_its_server_args():
    # An 80 GiB card at TP 1: chunked_prefill_size 8192, cuda_graph_max_bs
    # 256; reserved = 512 + 8192 x 1.5 + 256 x 2 + 1/8 x 1024 = 13440 MB
    # (above the 10 GiB floor); fraction = (81920 - 13440) / 81920 = 0.836.
    from planning.memory import sglang_fraction

    assert sglang_fraction(H100, 1) == round((81920 - 13440) / 81920, 3) == 0.836
    memory = card_memory(engine("sglang"), LLAMA, 1, 8192, 80 * GIB, total=H100)
    # The fraction is of what was free before the weights loaded
    # (profile_max_num_token's min_per_gpu_memory): the card less the 0.70 GiB
    # held then, which is itself beside the pool.
    before = round(0.70 * GIB)
    assert memory.budget == before + int((H100 - before) * 0.836)
    non_torch, reserved = memory.terms
    assert non_torch.name == "non_torch" and non_torch.inside and non_torch.bytes == before
    assert reserved.inside is False and reserved.bytes == H100 - memory.budget
    assert memory.need == LLAMA_WEIGHTS + GIB + before
    assert memory.kv_tokens == int((int((H100 - before) * 0.836) - LLAMA_WEIGHTS) / (GIB / 8192))


def test_the_memory_answer_carries_each_term_in_bytes():
    answer = card_memory(engine("vllm"), LLAMA, 2, 8192, None).as_dict()
    assert answer["overhead"] == sum(t["bytes"] for t in answer["terms"] if t["inside"])
    assert answer["need"] == answer["weights"] + answer["kv"] + answer["overhead"]
    assert answer["comm_buffers"] == COMM and answer["non_torch"] == NON_TORCH
    assert all(t["source"] for t in answer["terms"])


def test_the_cache_holds_what_is_left_of_the_budget():
    memory = card_memory(engine("vllm"), LLAMA, 1, 8192, 76 * GIB, total=H100)
    room = memory.budget - memory.weights - memory.overhead
    assert memory.kv_tokens == int(room / (memory.kv / 8192))
    assert memory.sequences == round(room / memory.kv, 2)


def test_trtllm_gives_its_cache_a_fraction_of_what_is_left_after_the_weights():
    # TensorRT-LLM's KvCacheConfig.free_gpu_memory_fraction (0.9) is of the
    # memory free once the weights and activations are in
    # (_torch/pyexecutor/_util.py), not of the whole card: its budget is what
    # is held plus 0.9 of the rest. The planning figure beside the weights is
    # the registry's runtime_gib, 2 GiB.
    held = LLAMA_WEIGHTS + 2 * GIB
    memory = card_memory(engine("trtllm"), LLAMA, 1, 8192, None, total=H100)
    assert memory.weights == LLAMA_WEIGHTS and memory.overhead == 2 * GIB
    assert memory.budget == held + int((H100 - held) * 0.9)
    assert "left" in memory.budget_how
    half = card_memory(
        engine("trtllm"),
        LLAMA,
        1,
        8192,
        None,
        total=H100,
        args=("--kv_cache_free_gpu_memory_fraction", "0.5"),
    )
    assert half.budget == held + int((H100 - held) * 0.5)
    # a larger model leaves less: the budget is not a fixed share of the card
    big = card_memory(engine("trtllm"), replace(LLAMA, weight_bytes=60 * GIB), 1, 8192, None, total=H100)
    assert big.budget - big.weights - big.overhead == int((H100 - 62 * GIB) * 0.9)


def _gpt_oss(name: str, total_size: int) -> Shape:
    import json
    from pathlib import Path

    from catalog.modelfiles import shape_from_config

    config = json.loads((Path(__file__).parents[1] / "fixtures" / "hf-configs" / f"{name}.json").read_text())
    read = shape_from_config(config, index={"metadata": {"total_size": total_size}, "weight_map": {}})
    return Shape(**{k: v for k, v in read.as_fields().items()})


def test_vllm_pads_mxfp4_experts_as_its_marlin_kernel_needs():
    # vllm mxfp4.py (Marlin, cards without native FP4): each card's expert width
    # rounded up to 128, the hidden size to 256. gpt-oss-120b: 36 layers x 128
    # experts x 3 x 2880 x 2880 at 17/32 bytes = 60,913,582,080 bytes of experts;
    # the rest (65,248,815,744 - that) splits as usual.
    shape = _gpt_oss("openai__gpt-oss-120b", 65_248_815_744)
    experts = 36 * 128 * 3 * 2880 * 2880 * 17 // 32
    assert shape.expert_bytes == experts and shape.expert_format == "mxfp4"
    rest = 65_248_815_744 - experts
    # TP 1: 2880 -> 2944, 2880 -> 3072
    one = card_memory(engine("vllm"), shape, 1, 8192, None)
    assert one.weights == rest + math.ceil(experts * (2944 / 2880) * (3072 / 2880))
    # vllm-project/vllm#23278, one H100, vLLM 0.10.1: "Model loading took 65.9651 GiB"
    assert one.weights / GIB == pytest.approx(65.9651, rel=0.005)
    # TP 2: 1440 -> 1536 a card, the hidden size still 3072: 13.8% over the even share
    # (the router gates, whole on every card, beside)
    gates = shape.replicated_bytes
    assert gates == 36 * 2880 * 128 * 2
    two = card_memory(engine("vllm"), shape, 2, 8192, None)
    padded = math.ceil(experts / 2 * (1536 / 1440) * (3072 / 2880))
    assert two.weights == math.ceil((rest - gates) / 2) + padded + gates
    assert two.weights > 65_248_815_744 / 2 * 1.1
    # SGLang's padding is not in the registry: its share is the even one
    sglang = card_memory(engine("sglang"), shape, 2, 8192, None)
    assert sglang.weights == math.ceil((65_248_815_744 - gates) / 2) + gates


def test_a_dense_or_unpadded_checkpoint_splits_evenly():
    plain = card_memory(engine("vllm"), LLAMA, 2, 8192, None)
    assert plain.weights == LLAMA_WEIGHTS // 2
