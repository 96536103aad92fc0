"""A replica across nodes, placed: its ranks, the group's nodes (one fabric domain, whole nodes by
best fit) and the engines' span modes."""

from __future__ import annotations

import pytest

from planning.engines import DEFAULT_PATH, RegistryError, engine, group_widths, load_registry, span_refusal
from planning.placement import LiveReplica, NodeCards, Placement, RankPlace, pick_group, place_restart


def test_a_one_node_placement_has_one_rank_and_keeps_its_node_and_cards():
    p = Placement("r1", "n1", (0, 1), in_place=False)
    assert p.ranks == (RankPlace(0, "n1", (0, 1)),)
    assert p.as_dict() == {
        "replica": "r1",
        "in_place": False,
        "ranks": [{"rank": 0, "node": "n1", "cards": [0, 1]}],
        "node": "n1",
        "cards": [0, 1],
    }
    assert p.text == "r1 → n1 cards 0, 1 (beside)"


def test_a_group_placement_lists_every_rank_and_keeps_rank_0s_node_and_cards():
    p = Placement.group("r1", [RankPlace(0, "n1", (0, 1)), RankPlace(1, "n2", (4, 5))], in_place=True)
    assert (p.node, p.cards) == ("n1", (0, 1))
    assert p.as_dict()["ranks"] == [
        {"rank": 0, "node": "n1", "cards": [0, 1]},
        {"rank": 1, "node": "n2", "cards": [4, 5]},
    ]
    assert p.text == "r1 → rank 0 on n1 cards 0, 1; rank 1 on n2 cards 4, 5 (in place)"


def test_node_and_cards_that_are_not_rank_0s_are_refused():
    with pytest.raises(ValueError, match="rank 0's"):
        Placement("r1", "n2", (0,), in_place=False, ranks=(RankPlace(0, "n1", (0,)),))


def test_a_group_goes_on_whole_nodes_of_one_fabric_domain_by_best_fit():
    free = {"a1": range(8), "a2": range(8), "b1": range(8), "b2": [4, 5, 6, 7], "b3": range(8)}
    fabric = {"a1": "ib-a", "a2": "ib-a", "b1": "ib-b", "b2": "ib-b", "b3": "ib-b"}
    # Four cards a rank: ib-b's b2 has exactly four free (the best fit), so ib-b's pair holds fewer free cards.
    ranks = pick_group(free, fabric, 4, 2)
    assert ranks == (RankPlace(0, "b2", (4, 5, 6, 7)), RankPlace(1, "b1", (0, 1, 2, 3)))
    # Eight a rank: b2 no longer fits; both domains have two whole nodes, ib-a first by name.
    assert pick_group(free, fabric, 8, 2) == (
        RankPlace(0, "a1", tuple(range(8))),
        RankPlace(1, "a2", tuple(range(8))),
    )
    # Three ranks of eight: only ib-b has three nodes, and one of them is not free enough.
    assert pick_group(free, fabric, 8, 3) is None


def test_a_node_without_a_fabric_domain_joins_no_group():
    free = {"n1": range(8), "n2": range(8)}
    assert pick_group(free, {"n1": "ib", "n2": ""}, 8, 2) is None
    assert pick_group(free, {"n1": "ib", "n2": "ib"}, 8, 2) is not None


def test_a_group_avoids_the_nodes_of_the_models_other_replicas():
    free = {"n1": range(8), "n2": range(8), "n3": range(8)}
    fabric = dict.fromkeys(free, "ib")
    ranks = pick_group(free, fabric, 8, 2, siblings={"n1"})
    assert [r.node for r in ranks or ()] == ["n2", "n3"]


def test_a_group_replica_frees_every_ranks_cards_for_the_steps_after_it():
    # Resized to one node of 8: r1 ran across n1 and n2, r2 on n3, r3 on n5; only n4 is free. r1's
    # replacement takes n4; once it is ready r1 frees n1 (rank 0) and n2 (rank 1), so r2 goes to n1
    # and r3 to n2 (before n3, which r2 frees, by name); were rank 1's cards not freed, r3 would go to n3.
    whole = tuple(range(8))
    nodes = [NodeCards(n, True, whole, ()) for n in ("n1", "n2", "n3", "n5")] + [
        NodeCards("n4", True, whole, whole)
    ]
    r1 = LiveReplica("r1", "n1", whole, ranks=(RankPlace(0, "n1", whole), RankPlace(1, "n2", whole)))
    replicas = [r1, LiveReplica("r2", "n3", whole), LiveReplica("r3", "n5", whole)]
    places = place_restart(nodes, replicas, 8, in_place=False)
    assert [(p.replica, p.node) for p in places] == [("r1", "n4"), ("r2", "n1"), ("r3", "n2")]


def test_the_engines_span_modes():
    assert engine("vllm").span == "pipeline" and engine("standin").span == "pipeline"
    assert engine("sglang").span == "tensor"
    for name in ("trtllm", "llamacpp", "freetoken"):
        assert engine(name).span == "none"
    assert "MPI world" in (span_refusal(engine("trtllm")) or "")
    assert "rpc-server" in (span_refusal(engine("llamacpp")) or "")
    assert "one card" in (span_refusal(engine("freetoken")) or "")
    assert span_refusal(engine("vllm")) is None


def test_the_widths_each_engine_runs_a_group_with():
    assert group_widths(engine("vllm"), 8, 2) == (8, 2)  # TP = a node's cards, PP = nodes
    assert group_widths(engine("sglang"), 8, 2) == (16, 1)  # TP over every card
    assert group_widths(engine("vllm"), 4, 1) == (4, 1)


@pytest.mark.parametrize(
    ("replacement", "key", "problem"),
    [
        ('span = "ring"', "span", "must be one of pipeline, tensor, none"),
        ('span = "tensor"\nspan_reason = "why"', "span_reason", "cannot span"),
        ('span = "tensor"\nspan_source = ""', "span_source", "must say where"),
    ],
)
def test_a_wrong_span_is_refused_at_load_naming_the_engine_and_key(tmp_path, replacement, key, problem):
    text = DEFAULT_PATH.read_text()
    at = text.index('span = "tensor"', text.index("[sglang]"))
    rest = text[at + len('span = "tensor"') :]
    if "span_source" in replacement:  # sglang's own span_source line (the next one) goes
        rest = "\n" + rest.split("\n", 2)[2]
    path = tmp_path / "engines.toml"
    path.write_text(text[:at] + replacement + rest)
    with pytest.raises(RegistryError) as err:
        load_registry(path)
    assert f"engine 'sglang', key {key!r}" in str(err.value) and problem in str(err.value)


def test_only_a_tensor_parallel_engine_spans_nodes(tmp_path):
    text = DEFAULT_PATH.read_text()
    llamacpp = text.index("[llamacpp]")
    start = text.index('span = "none"', llamacpp)
    end = text.index("\n\n", start)
    path = tmp_path / "engines.toml"
    path.write_text(text[:start] + 'span = "pipeline"\nspan_source = "a test"' + text[end:])
    with pytest.raises(RegistryError, match="only a tensor-parallel engine spans nodes"):
        load_registry(path)
