"""Planning a resize and a context change: every check, in docs/design.md's order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from base.errors import DomainError
from planning import plan_context, plan_resize
from planning.types import GPUClassSpec, ModelSpec, NodeRoom, ProfileSpec, Shape

GIB = 2**30
# vLLM's terms beside weights and KV at TP > 1 for a shape without its sizes
# (engines.toml [vllm.memory]): outside PyTorch 0.35 GiB, communication buffers
# 1.8 GiB, CUDA graphs 1 GiB; the activation peak is unknown here.
VLLM_TP_TERMS = round(0.35 * GIB) + round(1.8 * GIB) + GIB

# Llama-3.1-8B (see test_planning_memory for the arithmetic).
LLAMA = Shape(
    layers=32,
    attention_heads=32,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=131072,
    weight_bytes=16060522496,
    context_length=131072,
)
CLASSES = {
    "h100": GPUClassSpec("h100", 72 * GIB, "9.0"),
    "t4": GPUClassSpec("t4", 14 * GIB, "7.5"),
    "small": GPUClassSpec("small", 8 * GIB, "8.9"),
}
ROOMY = [
    NodeRoom("n1", True, "h100", 8, 8, 0),
    NodeRoom("s1", True, "small", 8, 8, 0),
    NodeRoom("t1", True, "t4", 8, 8, 0),
]


def vllm_profile(**kw) -> ProfileSpec:
    base = {
        "name": "gpu",
        "engine": "vllm",
        "gpu_class": "h100",
        "tp": 2,
        "gpus_per_node": 2,
        "args": ("--tensor-parallel-size", "2", "--max-model-len", "8192", "--enable-prefix-caching"),
    }
    return ProfileSpec(**{**base, **kw})


def llama(
    *profiles: ProfileSpec, shape: Shape | None = LLAMA, context: int | None = 131072, **kw
) -> ModelSpec:
    return ModelSpec(
        name="llama",
        context_length=context,
        declared=kw.get("declared", False),
        declared_in=kw.get("declared_in"),
        shape=shape,
        profiles=profiles or (vllm_profile(),),
    )


def resize(model: ModelSpec, gpus, *, profile=None, in_place=False, classes=CLASSES, nodes=ROOMY, running=1):
    return plan_resize(
        model=model,
        gpus=gpus,
        profile=profile,
        in_place=in_place,
        classes=classes,
        nodes=nodes,
        running=running,
    )


def context(
    model: ModelSpec, tokens, *, profile=None, in_place=False, classes=CLASSES, nodes=ROOMY, running=1
):
    return plan_context(
        model=model,
        tokens=tokens,
        profile=profile,
        in_place=in_place,
        classes=classes,
        nodes=nodes,
        running=running,
    )


def refusal(call) -> DomainError:
    with pytest.raises(DomainError) as caught:
        call()
    return caught.value


# -- resize: the answer --------------------------------------------------------------


def test_a_resize_answers_the_change_with_the_api_keys():
    change = resize(llama(), 4)
    body = change.as_dict()
    assert {"model", "profile", "engine", "gpu_class", "before", "after", "args", "per_card"} <= body.keys()
    assert {"restarted", "in_place", "note", "memory", "room"} <= body.keys()
    assert body["model"] == "llama"
    assert body["profile"] == "gpu"
    assert body["engine"] == "vllm"
    assert body["gpu_class"] == "h100"
    assert body["kind"] == "gpus"
    assert (body["before"], body["after"]) == (2, 4)
    # the profile's own TP width is dropped; the launcher sets it from tp
    assert body["args"] == ["--max-model-len", "8192", "--enable-prefix-caching"]
    assert body["per_card"] == "7.1 GiB on each of 4 cards, of 72 GiB usable on each"
    assert body["memory"]["need"] == 16060522496 // 4 + 131072 * 8192 // 4 + VLLM_TP_TERMS
    # places: the restart was not simulated (no fleet given), so no replica is placed
    assert body["room"] == {
        "in_place": False,
        "beside": ["n1"],
        "beside_count": 1,
        "in_place_nodes": ["n1"],
        "in_place_count": 1,
        "places": [],
    }
    assert (body["restarted"], body["in_place"], body["note"]) == (0, False, "")
    new = change.new_profile
    assert (new.tp, new.gpus_per_node, new.nodes, new.pp, new.cards) == (4, 4, 1, 0, 4)


def test_a_resize_in_place_when_only_the_models_own_cards_would_do():
    nodes = [NodeRoom("n1", True, "h100", 4, 2, 2)]
    change = resize(llama(), 4, in_place=True, nodes=nodes)
    assert change.in_place is True
    assert change.room.in_place_nodes == ("n1",)


def test_a_model_with_nothing_running_is_resized_without_room_beside():
    nodes = [NodeRoom("n1", True, "h100", 4, 0, 0)]
    assert resize(llama(), 4, nodes=nodes, running=0).in_place is False


def test_a_named_profile_is_the_one_resized():
    other = vllm_profile(name="other", engine="sglang", args=("--tp", "2"))
    change = resize(llama(vllm_profile(), other), 4, profile="other")
    assert (change.profile, change.engine, change.args) == ("other", "sglang", ())


def test_a_llamacpp_resize_splits_layers():
    p = ProfileSpec("gguf", "llamacpp", "h100", gpus_per_node=1, args=("-c", "8192", "-ts", "1"))
    change = resize(llama(p, shape=replace(LLAMA, weight_bytes=4920739232)), 3)
    assert change.args == ("-c", "8192")
    assert (change.new_profile.tp, change.new_profile.gpus_per_node) == (1, 3)


# -- resize: each refusal, in order ------------------------------------------------------


def test_a_declared_model_is_refused_first_saying_where_to_change_it():
    err = refusal(lambda: resize(llama(declared=True, declared_in="cluster.yaml (llmgw ctl config edit)"), 0))
    assert (err.code, err.status) == ("declared", 409)
    assert "cluster.yaml (llmgw ctl config edit)" in err.message
    assert err.change is None


@pytest.mark.parametrize("gpus", [0, -1, 65, True, 2.0, "4", None])
def test_a_card_count_outside_1_to_64_is_refused(gpus):
    err = refusal(lambda: resize(llama(), gpus))
    assert (err.code, err.status) == ("gpus_range", 400)
    assert "1 to 64 cards" in err.message
    assert err.change is None


@pytest.mark.parametrize(
    ("profiles", "named", "code"),
    [
        ((vllm_profile(),), "nope", "no_profile"),
        ((vllm_profile(gpu_class=None),), None, "cpu_only"),
        ((vllm_profile(), vllm_profile(name="b")), None, "ambiguous_profile"),
    ],
)
def test_a_profile_that_cannot_be_chosen_is_refused(profiles, named, code):
    err = refusal(lambda: resize(llama(*profiles), 4, profile=named))
    assert (err.code, err.status) == (code, 400)


def test_an_unknown_engine_is_refused_with_the_change():
    err = refusal(lambda: resize(llama(vllm_profile(engine="tgi")), 4))
    assert err.code == "unknown_engine"
    assert err.change["engine"] == "tgi"


def test_the_same_card_count_is_refused_as_unchanged():
    err = refusal(lambda: resize(llama(), 2))
    assert (err.code, err.status) == ("unchanged", 400)
    assert err.message == "llama's gpu profile already uses 2 cards."
    assert (err.change["before"], err.change["after"]) == (2, 2)


def test_an_old_card_is_refused_before_the_heads_are_looked_at():
    p = ProfileSpec("trt", "trtllm", "t4", args=())
    err = refusal(lambda: resize(llama(p), 6))  # 6 does not split the heads either
    assert (err.code, err.status) == ("capability", 400)
    assert "needs cards of compute capability 8.0 or newer; t4 cards are 7.5" in err.message
    assert err.change["after"] == 6


def test_a_count_the_heads_do_not_split_into_is_refused():
    err = refusal(lambda: resize(llama(), 6))
    assert (err.code, err.status) == ("heads", 400)
    assert "1, 2, 4, 8, 16 or 32" in err.message
    assert err.change["model"] == "llama"


def test_a_single_card_engine_is_refused_more_cards():
    p = ProfileSpec("ft", "freetoken", "h100")
    err = refusal(lambda: resize(llama(p), 2))
    assert (err.code, err.status) == ("single_card_engine", 400)


def test_too_little_memory_is_refused_naming_need_budget_and_both_ways_out():
    # 131072 tokens on 2 cards of 8 GiB: weights 16060522496 / 2 = 7.48 GiB,
    # KV 16 GiB / 2 = 8 GiB, vLLM's terms at TP 2 3.15 GiB: 18.63 GiB a card.
    model = llama(vllm_profile(gpu_class="small", tp=1, gpus_per_node=1, args=()))
    err = refusal(lambda: resize(model, 2))
    assert (err.code, err.status) == ("memory", 400)
    assert "On 2 small cards each would hold 18.6 GiB" in err.message
    assert "more than the 8 GiB usable" in err.message
    # more cards: on 4, 3.74 + 4 + 3.15 = 10.89 GiB does not fit; on 8, 1.87 + 2 + 3.15 = 7.02 does
    assert "more cards (8 cards would hold it)" in err.message
    # a shorter context: the weights and overhead alone are 8.98 GiB on 2
    assert "shorter context" in err.message
    assert "/api/models/llama/context/" in err.message
    assert err.change["memory"]["fits"] is False
    assert err.change["memory"]["budget"] == 8 * GIB
    assert err.change["per_card"] == "18.6 GiB on each of 2 cards, of 8 GiB usable on each"


def test_the_memory_refusal_names_the_longest_context_that_fits():
    # 4 cards of 8 GiB: 8589934592 − 4015130624 (weights) − 3382286745
    # (vLLM's terms) = 1192517223 bytes for the cache; each card keeps 2 of
    # the 8 KV heads, 131072 / 4 = 32768 bytes a token, in whole blocks of 16
    # tokens: 1192517223 // (32768 × 16) = 2274 blocks, 36384 tokens.
    model = llama(vllm_profile(gpu_class="small", args=("--max-model-len", "131072")))
    err = refusal(lambda: resize(model, 4))
    assert 8589934592 - 4015130624 - VLLM_TP_TERMS == 1192517223
    assert 1192517223 // (32768 * 16) * 16 == 36384
    assert "at most 36384 tokens fits on 4 cards" in err.message


def test_memory_is_checked_before_room():
    model = llama(vllm_profile(gpu_class="small", tp=1, gpus_per_node=1, args=()))
    assert refusal(lambda: resize(model, 2, nodes=[])).code == "memory"


@pytest.mark.parametrize(
    ("nodes", "in_place", "code", "each"),
    [
        ([], False, "no_class", 4),
        # 4 cards on nodes of 2: planned across 2 nodes (a pipeline stage of 2 cards each), and n1 is
        # the only node, in no fabric domain.
        ([NodeRoom("n1", True, "h100", 2, 2, 0)], False, "too_few_cards", 2),
        ([NodeRoom("n1", True, "h100", 8, 1, 2)], True, "no_room", 4),
        ([NodeRoom("n1", True, "h100", 8, 2, 2)], False, "no_room_beside", 4),
    ],
)
def test_no_room_is_refused_with_the_whole_change(nodes, in_place, code, each):
    err = refusal(lambda: resize(llama(), 4, nodes=nodes, in_place=in_place))
    assert (err.code, err.status) == (code, 409)
    assert err.change["memory"]["cards"] == each
    assert err.change["args"] == ["--max-model-len", "8192", "--enable-prefix-caching"]


# -- resize: what is not checked is said once ---------------------------------------------


def test_an_unknown_shape_is_said_once_and_not_refused():
    change = resize(llama(shape=None), 6)  # 6 would not split 8 KV heads
    assert change.note == (
        "llama's shape is not known, so how its heads split over the cards and what each card holds are not checked."
    )
    assert change.memory is None
    assert change.per_card == ""


def test_an_unknown_context_skips_only_the_memory_check():
    p = vllm_profile(args=())
    change = resize(llama(p, context=None, shape=replace(LLAMA, context_length=None)), 4)
    assert change.note == "llama's context is not known, so what each card holds is not checked."


def test_unknown_heads_and_weights_are_named_together():
    shape = replace(LLAMA, kv_heads=None, weight_bytes=None)
    change = resize(llama(shape=shape), 4)
    assert change.note == (
        "llama's KV heads and weight bytes are not known, so how its heads split over the cards and what "
        "each card holds are not checked."
    )


def test_an_unknown_class_skips_budget_and_capability_but_not_room():
    classes = {}
    change = resize(llama(), 4, classes=classes)
    assert "h100 class is not in the catalog" in change.note
    assert change.memory.budget is None
    assert change.per_card == "7.1 GiB on each of 4 cards"
    assert refusal(lambda: resize(llama(), 4, classes=classes, nodes=[])).code == "no_class"


def test_a_partial_change_carries_the_note():
    err = refusal(lambda: resize(llama(shape=None), 4, nodes=[]))
    assert "shape is not known" in err.change["note"]


# -- context ---------------------------------------------------------------------------


def test_a_context_change_sets_the_engine_flag_and_checks_memory_at_the_current_cards():
    p = vllm_profile(args=("--tensor-parallel-size", "2", "--max_model_len=8192", "--enable-prefix-caching"))
    change = context(llama(p), 32768)
    assert change.kind == "context"
    assert (change.before, change.after) == (8192, 32768)
    # The TP spelling is the launcher's (the profile's tp field, 2): it goes with the change.
    assert change.args == (
        "--enable-prefix-caching",
        "--max-model-len",
        "32768",
    )
    assert change.new_profile.tp == 2
    # 2 cards: 16060522496 / 2 + 131072 × 32768 / 2 + vLLM's terms at TP 2
    assert change.memory.need == 8030261248 + 2 * GIB + VLLM_TP_TERMS
    assert change.memory.cards == 2
    assert change.new_profile.cards == 2


def test_a_llamacpp_context_change_replaces_every_spelling_and_the_variable():
    p = ProfileSpec(
        "gguf", "llamacpp", "h100", args=("-c", "4096", "-ngl", "99"), env=(("LLAMA_ARG_CTX_SIZE", "2048"),)
    )
    change = context(llama(p, shape=replace(LLAMA, weight_bytes=4920739232)), 16384)
    assert change.before == 4096
    assert change.args == ("-ngl", "99", "--ctx-size", "16384")
    assert change.new_profile.env == ()


def test_a_freetoken_context_change_writes_its_override():
    shape = Shape(
        layers=48,
        attention_heads=32,
        kv_heads=4,
        kv_bytes_per_token=98304,
        weight_bytes=61064245248,
        expert_bytes=57982058496,
    )
    p = ProfileSpec("ft", "freetoken", "h100")
    change = context(llama(p, shape=shape, context=40960), 16384)
    assert change.args == ("--max-seq-len-override", "16384")
    assert change.memory.weights == 3082186752  # the experts stay in host memory


@pytest.mark.parametrize("tokens", [0, -5, 131073, True, 4096.0, "4096", None])
def test_a_context_outside_the_models_range_is_refused(tokens):
    err = refusal(lambda: context(llama(), tokens))
    assert (err.code, err.status) == ("context_range", 400)
    assert "1 to 131072 tokens" in err.message


def test_a_model_of_unknown_context_takes_any_positive_one_up_to_the_ceiling():
    change = context(llama(context=None, shape=None), 10**6)
    assert change.after == 10**6
    assert "shape is not known" in change.note
    assert refusal(lambda: context(llama(context=None), 0)).message.startswith(
        "llama's context can be 1 to 16777216 tokens (the model does not say its own limit)"
    )


def test_the_same_context_is_refused_as_unchanged():
    err = refusal(lambda: context(llama(), 8192))
    assert (err.code, err.status) == ("unchanged", 400)
    assert "already serves a context of 8192 tokens" in err.message


def test_a_declared_model_keeps_its_context():
    assert refusal(lambda: context(llama(declared=True), 4096)).code == "declared"


def test_a_context_too_long_for_the_cards_is_refused_with_both_ways_out():
    # 2 cards of 14 GiB (t4, 7.5: new enough for vLLM's 7.0): weights 7.48
    # GiB + KV 131072 × 131072 / 2 = 8 GiB + vLLM's terms 3.15 = 18.63 GiB a card.
    model = llama(vllm_profile(gpu_class="t4"))
    err = refusal(lambda: context(model, 131072))
    assert (err.code, err.status) == ("memory", 400)
    assert "more than the 14 GiB usable" in err.message
    assert "more cards (4 cards would hold it)" in err.message
    # 15032385536 − 8030261248 − 3382286745 = 3619837543 bytes for the cache,
    # 131072 / 2 = 65536 bytes a token a card, whole blocks of 16: 55232 tokens.
    assert (15032385536 - 8030261248 - VLLM_TP_TERMS) // (65536 * 16) * 16 == 55232
    assert "at most 55232 tokens fits on 2 cards" in err.message
    assert err.change["kind"] == "context"


def test_a_context_change_needs_room_for_the_current_cards():
    nodes = [NodeRoom("n1", True, "h100", 8, 1, 2)]
    err = refusal(lambda: context(llama(), 16384, nodes=nodes))
    assert err.code == "no_room_beside"
    assert context(llama(), 16384, nodes=nodes, in_place=True).in_place is True


def test_a_context_change_refuses_an_old_card():
    p = ProfileSpec("trt", "trtllm", "t4")
    assert refusal(lambda: context(llama(p), 4096)).code == "capability"


def test_a_context_without_a_known_limit_still_has_a_ceiling():
    from planning.plan import MAX_UNKNOWN_CONTEXT

    with pytest.raises(DomainError) as err:
        context(llama(context=None), MAX_UNKNOWN_CONTEXT + 1)
    assert err.value.code == "context_range"
    assert f"1 to {MAX_UNKNOWN_CONTEXT} tokens" in err.value.message
    assert context(llama(context=None, shape=None), MAX_UNKNOWN_CONTEXT).after == MAX_UNKNOWN_CONTEXT


def test_a_dry_run_refuses_a_profile_the_save_would_refuse():
    risky = llama(vllm_profile(args=("--trust-remote-code",)))
    with pytest.raises(DomainError) as err:
        resize(risky, 4)
    assert err.value.code == "refused_arg"
    assert "--trust-remote-code" in err.value.message
    assert err.value.change is not None and err.value.change["after"] == 4
