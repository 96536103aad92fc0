"""The planner across nodes on plain data: how many nodes, the profile per engine, the stages'
layers and memory, and every rank of every replica placed in restart order."""

from __future__ import annotations

import pytest

from base.errors import DomainError
from planning.engines import engine
from planning.groups import Span, group_refusal, nodes_for, place_group_restart, respread_group
from planning.placement import LiveReplica, NodeCards, RankPlace
from planning.plan import plan_resize
from planning.stages import pipeline_memory, stage_layers, stage_shape
from planning.types import GPUClassSpec, ModelSpec, NodeRoom, ProfileSpec, Shape
from planning.units import GIB

# Llama-3.1-405B's config.json (tests/fixtures/hf-configs): 126 layers, 128 heads, 8 KV heads of 128,
# hidden 16384, intermediate 53248, vocabulary 128256; 811706777600 bytes of bf16 weights (derived).
LLAMA_405B = Shape(
    layers=126,
    attention_heads=128,
    kv_heads=8,
    head_dim=128,
    attention="gqa",
    kv_bytes_per_token=126 * 8 * 128 * 2 * 2,
    weight_bytes=811706777600,
    hidden_size=16384,
    intermediate_size=53248,
    vocab_size=128256,
)
VLLM_8 = ProfileSpec("h100", "vllm", "h100-80g", gpus_per_node=8, tp=8, args=("--max-model-len", "32768"))


@pytest.mark.parametrize(
    ("layers", "stages", "counts"),
    [(126, 2, [63, 63]), (126, 4, [31, 32, 32, 31]), (10, 4, [2, 3, 3, 2]), (32, 3, [11, 11, 10])],
)
def test_stages_split_layers_as_vllm_does(layers, stages, counts):
    # vLLM's get_pp_indices: layers // PP each, the remainder one each to the stages before the last.
    assert stage_layers(layers, stages) == counts
    assert sum(counts) == layers


def test_a_stage_holds_its_layers_share_and_the_embedding_or_the_head():
    embedding = 128256 * 16384 * 2
    first, last = stage_shape(LLAMA_405B, 0, 2), stage_shape(LLAMA_405B, 1, 2)
    decoder = 811706777600 - 2 * embedding
    assert first.weight_bytes == round(decoder / 2) + embedding
    assert last.weight_bytes == round(decoder / 2) + embedding
    middle = stage_shape(LLAMA_405B, 1, 3)
    assert middle.weight_bytes == round(decoder * 42 / 126)  # neither end
    assert (first.vocab_size, last.vocab_size) == (0, 128256)  # only the last stage samples
    assert first.kv_bytes_per_token == LLAMA_405B.kv_bytes_per_token // 2


def test_the_fullest_stage_is_the_last_one_with_the_sampler():
    stages = pipeline_memory(engine("vllm"), LLAMA_405B, 8, 2, 32768, 73400 * 2**20, total=81559 * 2**20)
    assert stages is not None
    assert stages[0].memory.weights == stages[1].memory.weights
    assert stages[1].memory.need > stages[0].memory.need  # the sampler's logits on the last rank


@pytest.mark.parametrize(
    ("gpus", "most", "asked", "span"),
    [
        (8, 8, None, Span(1, 8)),
        (16, 8, None, Span(2, 8)),
        (24, 8, None, Span(3, 8)),
        (12, 8, None, Span(2, 6)),  # the fewest nodes that divide it with a node's share
        (16, 8, 4, Span(4, 4)),
        (8, 8, 2, Span(2, 4)),
        (13, 8, None, Span(13, 1)),
        (16, 0, None, Span(1, 16)),  # no node of the class known: the room check says why
    ],
)
def test_the_fewest_nodes_that_divide_the_cards_or_those_asked(gpus, most, asked, span):
    assert nodes_for(gpus, most, asked) == span


def test_nodes_that_do_not_divide_the_cards_are_refused():
    with pytest.raises(DomainError) as err:
        nodes_for(16, 8, 3)
    assert err.value.code == "nodes_range" and "1, 2, 4, 8 or 16" in err.value.message


def test_vllm_runs_tp_a_node_and_a_stage_a_node_sglang_tp_over_every_card():
    vllm = respread_group(VLLM_8, Span(2, 8), LLAMA_405B, engine("vllm"))
    assert (vllm.tp, vllm.gpus_per_node, vllm.nodes, vllm.pp, vllm.cards) == (8, 8, 2, 2, 16)
    sglang_p = ProfileSpec("h100", "sglang", "h100-80g", gpus_per_node=8, tp=8)
    sglang = respread_group(sglang_p, Span(2, 8), LLAMA_405B, engine("sglang"))
    assert (sglang.tp, sglang.gpus_per_node, sglang.nodes, sglang.pp, sglang.cards) == (8, 8, 2, 0, 16)


def test_sglang_across_three_nodes_of_8_is_tp_24_which_does_not_split_128_heads():
    p = ProfileSpec("h100", "sglang", "h100-80g", gpus_per_node=8, tp=8)
    with pytest.raises(DomainError) as err:
        respread_group(p, Span(3, 8), LLAMA_405B, engine("sglang"))
    assert err.value.code == "heads" and "tensor parallel 24 wide" in err.value.message


def test_more_stages_than_layers_are_refused():
    with pytest.raises(DomainError) as err:
        respread_group(VLLM_8, Span(4, 1), Shape(layers=3), engine("vllm"))
    assert err.value.code == "layers" and "3 layers" in err.value.message


def cards(name: str, fabric: str = "ib", held: tuple[int, ...] = ()) -> NodeCards:
    return NodeCards(name, True, tuple(range(8)), tuple(i for i in range(8) if i not in held), fabric=fabric)


def group(name: str, *nodes: str) -> LiveReplica:
    ranks = tuple(RankPlace(i, n, tuple(range(8))) for i, n in enumerate(nodes))
    return LiveReplica(name, nodes[0], tuple(range(8)), ranks=ranks)


def rooms(*nodes: NodeCards) -> list[NodeRoom]:
    return [NodeRoom(c.node, True, "h100", 8, len(c.free), 0, fabric=c.fabric) for c in nodes]


def test_a_rolling_restart_of_two_groups_places_the_second_on_the_first_ones_freed_nodes():
    nodes = [cards("n1", held=tuple(range(8))), cards("n2", held=tuple(range(8)))]
    nodes += [cards("n3", held=tuple(range(8))), cards("n4", held=tuple(range(8)))]
    nodes += [cards("n5"), cards("n6")]
    replicas = [group("r1", "n1", "n2"), group("r2", "n3", "n4")]
    places = place_group_restart(
        nodes, replicas, Span(2, 8), in_place=False, rooms=rooms(*nodes), gpu_class="h100"
    )
    assert [[r.node for r in p.ranks] for p in places] == [["n5", "n6"], ["n1", "n2"]]
    assert not any(p.in_place for p in places)


def test_two_steps_at_once_do_not_see_each_others_freed_nodes():
    nodes = [cards("n1", held=tuple(range(8))), cards("n2", held=tuple(range(8))), cards("n5"), cards("n6")]
    nodes += [cards("n3", held=tuple(range(8))), cards("n4", held=tuple(range(8)))]
    replicas = [group("r1", "n1", "n2"), group("r2", "n3", "n4")]
    with pytest.raises(DomainError) as err:
        place_group_restart(
            nodes, replicas, Span(2, 8), in_place=False, rooms=rooms(*nodes), gpu_class="h100", parallel=2
        )
    assert err.value.code == "no_room_beside"
    assert err.value.message.startswith("r2: rank 0 of 2 has no place")


def test_in_place_stops_every_rank_and_takes_the_freed_nodes():
    nodes = [cards("n1", held=tuple(range(8))), cards("n2", held=tuple(range(8)))]
    (place,) = place_group_restart(
        nodes, [group("r1", "n1", "n2")], Span(2, 8), in_place=True, rooms=rooms(*nodes), gpu_class="h100"
    )
    assert place.in_place and [r.node for r in place.ranks] == ["n1", "n2"]


def test_a_node_refused_for_its_release_takes_no_rank_and_is_named():
    nodes = [cards("n1"), cards("n2")]
    err = group_refusal(
        "no_room",
        rooms(*nodes),
        "h100",
        Span(2, 8),
        free={"n1": 8, "n2": 8},
        refused={"n2": "n2 does not have vllm 0.21.0 installed"},
    )
    assert "rank 1 of 2 has no place" in err.message
    assert "n2 does not have vllm 0.21.0 installed (release)" in err.message
    with pytest.raises(DomainError):
        place_group_restart(
            nodes,
            [group("r1", "n1", "n2")],
            Span(2, 8),
            in_place=True,
            rooms=rooms(*nodes),
            gpu_class="h100",
            refused={"n2": "n2 does not have vllm 0.21.0 installed"},
        )


def plan_405b(gpus: int, rooms: list[NodeRoom], cls: GPUClassSpec, engine_name: str = "vllm"):
    context_flag = {"vllm": "--max-model-len", "sglang": "--context-length"}[engine_name]
    p = ProfileSpec("p", engine_name, cls.name, gpus_per_node=8, tp=8, args=(context_flag, "32768"))
    model = ModelSpec("llama-405b", 131072, False, None, LLAMA_405B, (p,))
    return plan_resize(
        model=model, gpus=gpus, profile=None, in_place=False, classes={cls.name: cls}, nodes=rooms, running=0
    )


def test_a_stage_that_does_not_fit_is_refused_naming_the_rank_and_the_nodes_that_would_hold_it():
    # L4s of 24 GiB: 16 cards hold 405B's 756 GiB of weights nowhere near.
    l4 = GPUClassSpec("l4", 22 * GIB, "8.9", total_bytes=24 * GIB)
    rooms = [NodeRoom(f"n{i}", True, "l4", 8, 8, 0, fabric="ib") for i in range(8)]
    with pytest.raises(DomainError) as err:
        plan_405b(16, rooms, l4)
    assert err.value.code == "memory"
    assert err.value.message.startswith(
        "Rank 0 (pipeline stage 0: layers 0-62 with the embedding) would hold"
    )
    assert "more nodes (" in err.value.message and "of 8 cards" in err.value.message
    # The nodes it names do hold it: every stage fits there.
    more = int(err.value.message.split("more nodes (")[1].split(" of 8")[0])
    change = plan_405b(
        8 * more, [*rooms, *(NodeRoom(f"m{i}", True, "l4", 8, 8, 0, fabric="ib") for i in range(8))], l4
    )
    assert all(s.memory.fits for s in change.stages) and len(change.stages) == more


def test_sglang_across_two_nodes_is_one_memory_at_tp_16():
    h100 = GPUClassSpec("h100-80g", 73400 * 2**20, "9.0", total_bytes=81559 * 2**20)
    rooms = [NodeRoom(f"n{i}", True, "h100-80g", 8, 8, 0, fabric="ib") for i in range(2)]
    change = plan_405b(16, rooms, h100, "sglang")
    assert change.stages == () and change.memory is not None and change.memory.cards == 16
    assert change.new_profile is not None and (change.new_profile.tp, change.new_profile.nodes) == (8, 2)
    assert change.launch[change.launch.index("--tp-size") + 1] == "16"
