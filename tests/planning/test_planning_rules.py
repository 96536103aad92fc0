"""The profile rules: which profile, how it spreads over N cards, its context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from base.errors import DomainError
from catalog.modelfiles import shape_from_config
from planning.engines import engine
from planning.rules import card_count, context_of, pick_profile, respread, splits_heads
from planning.types import ModelSpec, ProfileSpec, Shape

HF_CONFIGS = Path(__file__).parents[1] / "fixtures" / "hf-configs"


def profile(
    name: str = "gpu", engine_name: str = "vllm", gpu_class: str | None = "h100", **kw
) -> ProfileSpec:
    return ProfileSpec(name=name, engine=engine_name, gpu_class=gpu_class, **kw)


def model(*profiles: ProfileSpec, context: int | None = 131072, shape: Shape | None = None) -> ModelSpec:
    return ModelSpec(
        name="llama", context_length=context, declared=False, declared_in=None, shape=shape, profiles=profiles
    )


GQA = Shape(layers=32, attention_heads=32, kv_heads=8, head_dim=128, attention="gqa")


# -- the card count --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, 1),
        ({"tp": 4}, 4),
        ({"gpus_per_node": 8, "tp": 4}, 8),
        ({"tp": 4, "nodes": 2}, 8),
        ({"tp": 8, "pp": 2, "nodes": 1}, 16),
        ({"gpus_per_node": 0, "tp": 0, "nodes": 0, "pp": 0}, 1),
    ],
)
def test_card_count_is_the_widest_per_node_times_the_most_stages(kw, expected):
    assert card_count(profile(**kw)) == expected


# -- which profile -----------------------------------------------------------------

CPU = profile("cpu", "llamacpp", None)
A = profile("a")
B = profile("b", "sglang")


@pytest.mark.parametrize(
    ("profiles", "named", "chosen"),
    [
        ((A,), None, "a"),
        ((CPU, A), None, "a"),
        ((A, B), "b", "b"),
        ((A, B), "a", "a"),
        ((A,), "", "a"),  # an empty name is no name
    ],
)
def test_pick_profile_takes_the_named_one_or_the_only_one_on_cards(profiles, named, chosen):
    assert pick_profile(model(*profiles), named).name == chosen


@pytest.mark.parametrize(
    ("profiles", "named", "code", "words"),
    [
        ((CPU, A), "cpu", "cpu_only", "llama's cpu profile runs on CPUs; give it a GPU class first"),
        ((A, B), "c", "no_profile", "llama has no profile 'c'; its profiles are a and b"),
        ((), "c", "no_profile", "it has no profiles"),
        ((CPU,), None, "cpu_only", "llama runs on CPUs only"),
        ((), None, "cpu_only", "llama runs on CPUs only"),
        ((CPU, A, B), None, "ambiguous_profile", "several profiles on cards (a and b): name one"),
    ],
)
def test_pick_profile_refuses(profiles, named, code, words):
    with pytest.raises(DomainError) as caught:
        pick_profile(model(*profiles), named)
    assert caught.value.code == code
    assert caught.value.status == 400
    assert words in caught.value.message


# -- the head split ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kv", "attention", "n", "ok"),
    [
        (8, 32, 4, True),  # n divides the KV heads
        (8, 32, 16, True),  # the KV heads divide n; 16 divides 32
        (8, 32, 64, False),  # 64 does not divide 32 attention heads
        (8, 32, 6, False),
        (8, 32, 3, False),
        (4, 28, 4, True),  # Qwen2.5-7B on 4
        (4, 28, 8, False),  # 8 does not divide 28
        (1, 32, 8, True),  # MQA: every card keeps the one head
        (None, None, 7, True),  # unknown: not checked
        (8, None, 16, True),
        (None, 32, 6, False),  # what is known still counts
        (0, 0, 5, True),  # 0 is unknown, not a head count
    ],
)
def test_splits_heads(kv, attention, n, ok):
    assert splits_heads(kv, attention, n) is ok


# Real checkpoints (tests/fixtures/hf-configs), read as the importer reads them, and the card
# counts vLLM's tensor parallelism takes or refuses for them: TP must divide the attention heads,
# and the KV heads must split evenly over the cards or be replicated a whole number of times.
REAL_SPLITS = [
    (
        "meta-llama__Llama-3.1-8B-Instruct",
        {1: True, 2: True, 4: True, 8: True, 16: True, 3: False, 64: False},
    ),
    ("Qwen__Qwen2.5-7B", {1: True, 2: True, 4: True, 7: False, 8: False, 14: False}),
    ("Qwen__Qwen3-30B-A3B", {4: True, 8: True, 32: True, 6: False, 64: False}),
    ("google__gemma-3-27b-it", {2: True, 16: True, 32: True, 12: False}),
    ("microsoft__Phi-3-mini-4k-instruct", {1: True, 8: True, 32: True, 3: False, 64: False}),
    ("openai__gpt-oss-20b", {8: True, 16: True, 64: True, 3: False, 12: False}),
]


@pytest.mark.parametrize(("config", "cards"), REAL_SPLITS, ids=[c for c, _ in REAL_SPLITS])
def test_the_head_split_of_real_checkpoints(config, cards):
    raw = json.loads((HF_CONFIGS / f"{config}.json").read_text())
    shape = shape_from_config(raw, source=f"{config}/config.json")
    said = {n: splits_heads(shape.kv_heads, shape.attention_heads, n) for n in cards}
    assert said == cards


# -- respread --------------------------------------------------------------------


def test_respread_for_tensor_parallel_drops_every_tp_spelling_and_sets_tp():
    p = profile(
        tp=2,
        gpus_per_node=2,
        nodes=2,
        pp=2,
        args=(
            "--tensor-parallel-size",
            "2",
            "-tp=2",
            "--tensor_parallel_size",
            "2",
            "--max-model-len",
            "8192",
        ),
    )
    new = respread(p, 4, GQA, engine("vllm"))
    assert new.args == ("--max-model-len", "8192")
    assert (new.tp, new.gpus_per_node, new.nodes, new.pp) == (4, 4, 1, 0)
    assert new.cards == 4


def test_respread_for_sglang_keeps_flags_that_merely_share_a_prefix():
    p = profile(engine_name="sglang", args=("--tp", "2", "--tp-size=2", "--tokenizer-mode", "slow"))
    assert respread(p, 2, GQA, engine("sglang")).args == ("--tokenizer-mode", "slow")


def test_respread_refuses_a_count_the_heads_do_not_split_into():
    with pytest.raises(DomainError) as caught:
        respread(profile(), 6, GQA, engine("vllm"))
    assert caught.value.code == "heads"
    assert caught.value.status == 400
    assert "8 KV heads and 32 attention heads" in caught.value.message
    assert "over 6 cards" in caught.value.message
    assert "1, 2, 4, 8, 16 or 32" in caught.value.message


def test_respread_does_not_check_heads_it_does_not_know():
    assert respread(profile(), 6, None, engine("vllm")).tp == 6


def test_respread_for_llamacpp_splits_layers_and_drops_the_old_split():
    p = profile(
        engine_name="llamacpp",
        args=("-ts", "1,1", "--tensor-split=3,1", "-c", "4096"),
        env=(("LLAMA_ARG_TENSOR_SPLIT", "1,1"), ("LLAMA_ARG_THREADS", "8")),
        gpus_per_node=2,
    )
    new = respread(p, 3, GQA, engine("llamacpp"))
    assert new.args == ("-c", "4096")
    assert new.env == (("LLAMA_ARG_THREADS", "8"),)
    assert (new.tp, new.gpus_per_node, new.nodes, new.pp) == (1, 3, 1, 0)


def test_respread_keeps_a_single_card_engine_on_one_card():
    p = profile(engine_name="freetoken", gpus_per_node=2)
    assert respread(p, 1, GQA, engine("freetoken")).cards == 1
    with pytest.raises(DomainError) as caught:
        respread(p, 2, GQA, engine("freetoken"))
    assert caught.value.code == "single_card_engine"
    assert caught.value.message == (
        "A freetoken replica runs on one card; 2 cards were asked for. Ask for 1, or give the profile an "
        "engine that spreads over cards."
    )


@given(
    st.sampled_from(["vllm", "sglang", "trtllm", "llamacpp"]),
    st.integers(1, 64),
    st.integers(0, 8),
    st.integers(0, 8),
    st.integers(0, 4),
    st.integers(0, 4),
)
def test_the_card_count_after_a_respread_is_n(name, n, tp, per_node, nodes, pp):
    eng = engine(name)
    assume(eng.spread != "tensor" or splits_heads(GQA.kv_heads, GQA.attention_heads, n))
    p = profile(engine_name=name, tp=tp, gpus_per_node=per_node, nodes=nodes, pp=pp)
    assert respread(p, n, GQA, eng).cards == n


# -- context ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine_name", "args", "env", "context", "expected"),
    [
        ("vllm", ("--max-model-len", "8192"), (), 131072, 8192),
        ("vllm", ("--max_model_len=4096",), (), 131072, 4096),
        ("sglang", ("--context-length", "16384"), (), 131072, 16384),
        ("trtllm", ("--max_seq_len", "2048"), (), 131072, 2048),
        ("llamacpp", ("--ctx-size", "4096"), (), 131072, 4096),
        ("llamacpp", ("-c", "4096", "--ctx-size=8192"), (), 131072, 8192),
        ("llamacpp", ("-c", "0"), (), 131072, 131072),  # 0: the model's own
        ("llamacpp", (), (("LLAMA_ARG_CTX_SIZE", "2048"),), 131072, 2048),
        ("llamacpp", ("-c", "1024"), (("LLAMA_ARG_CTX_SIZE", "2048"),), 131072, 1024),  # the flag wins
        ("freetoken", ("--max-seq-len-override", "65536"), (), 131072, 65536),
        # another engine's spelling is not this engine's
        ("vllm", ("--context-length", "2048"), (), 131072, 131072),
        ("vllm", ("--max-model-len", "lots"), (), 131072, 131072),
        ("vllm", (), (), None, None),
    ],
)
def test_context_of_reads_the_engine_flag_else_the_model(engine_name, args, env, context, expected):
    p = profile(engine_name=engine_name, args=args, env=env)
    assert context_of(model(p, context=context), p, engine(engine_name)) == expected


def test_context_of_falls_back_to_the_shape_context():
    p = profile()
    m = model(p, context=None, shape=Shape(context_length=32768))
    assert context_of(m, p, engine("vllm")) == 32768
