"""The whole restart played through before it starts: every replica placed in
the restart's order, or a refusal naming the one with no place."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from base.errors import DomainError
from planning.placement import LiveReplica, NodeCards, Placement, place_restart


def node(
    name: str, count: int, held: frozenset[int] | set[int] = frozenset(), *, ready: bool = True
) -> NodeCards:
    indices = tuple(range(count))
    return NodeCards(name, ready, indices, tuple(i for i in indices if i not in held))


def test_the_issues_two_replicas_in_place_to_eight_cards_has_no_place_for_the_one_beside_another_model():
    # llama on gpu-h1 (6 cards: 1 its own, 5 another model's... here 4 held by
    # another model, 1 by llama, 1 free) and on gpu-h2 (8 cards, 1 llama's).
    # Resized to 8 in place: gpu-h2 can take its own replica's replacement,
    # but gpu-h1's has no place: at its turn (first, by name) no node has 8
    # free, and gpu-h1 has only 6 cards even with llama's own freed.
    nodes = [node("gpu-h1", 6, {0, 1, 2, 3, 4}), node("gpu-h2", 8, {0})]
    replicas = [LiveReplica("llama-a", "gpu-h1", (4,)), LiveReplica("llama-b", "gpu-h2", (0,))]
    with pytest.raises(DomainError) as err:
        place_restart(nodes, replicas, 8, in_place=True, gpu_class="h100")
    assert err.value.code == "no_room" and err.value.status == 409
    assert err.value.message.startswith("llama-a has no place")
    assert "gpu-h1 has only 2 with llama-a's own freed" in err.value.message


def test_a_replica_without_room_beside_is_refused_by_name_when_in_place_was_not_asked():
    nodes = [node("n1", 4, {0, 1})]
    with pytest.raises(DomainError) as err:
        place_restart(nodes, [LiveReplica("r1", "n1", (0, 1))], 4, in_place=False, gpu_class="h100")
    assert err.value.code == "no_room_beside"
    assert "r1 has no place" in err.value.message and "Restarting in place" in err.value.message
    assert "2 at most" in err.value.message


def test_rolling_places_each_replacement_beside_on_the_cards_earlier_steps_free():
    # Two replicas of 2 cards on a 4-card node and 2 free on another: the
    # first goes to n2 (away from its sibling on n1); its old cards on n1
    # come free, so the second (whose sibling is now on n2) goes back to n1.
    nodes = [node("n1", 4, {0, 1, 2, 3}), node("n2", 2)]
    replicas = [LiveReplica("r1", "n1", (0, 1)), LiveReplica("r2", "n1", (2, 3))]
    places = place_restart(nodes, replicas, 2, in_place=False)
    assert places == (
        Placement("r1", "n2", (0, 1), in_place=False),
        Placement("r2", "n1", (0, 1), in_place=False),
    )


def test_steps_run_together_do_not_see_each_others_freed_cards():
    nodes = [node("n1", 4, {0, 1, 2, 3}), node("n2", 2)]
    replicas = [LiveReplica("r1", "n1", (0, 1)), LiveReplica("r2", "n1", (2, 3))]
    with pytest.raises(DomainError) as err:
        place_restart(nodes, replicas, 2, in_place=False, parallel=2)
    assert err.value.message.startswith("r2 has no place")


def test_in_place_is_only_for_the_replicas_with_no_room_beside():
    # r1 has no room beside (n1 full, n2 holds 1 free of 2 needed); in place
    # on its own node. Its old cards are reused, so r2's turn finds none
    # beside either and also goes in place.
    nodes = [node("n1", 2, {0, 1}), node("n2", 3, {0, 1})]
    replicas = [LiveReplica("r1", "n1", (0, 1)), LiveReplica("r2", "n2", (0, 1))]
    places = place_restart(nodes, replicas, 2, in_place=True)
    assert places == (Placement("r1", "n1", (0, 1), True), Placement("r2", "n2", (0, 1), True))
    # Growing to 3: r2's node has its own 2 and 1 free; r1's has only 2.
    with pytest.raises(DomainError) as err:
        place_restart(nodes, replicas, 3, in_place=True)
    assert err.value.message.startswith("r1 has no place")


def test_another_profiles_replica_is_a_sibling_but_is_not_restarted():
    nodes = [node("n1", 4, {0}), node("n2", 4, {0})]
    replicas = [LiveReplica("a", "n1", (0,)), LiveReplica("other", "n2", (0,), restarted=False)]
    (place,) = place_restart(nodes, replicas, 1, in_place=False)
    # n2 holds the model's other replica (another profile's, not restarted);
    # n1 holds only a itself, so a's replacement goes beside it on n1.
    assert place == Placement("a", "n1", (1,), False)


def test_a_node_that_is_not_ready_takes_nothing():
    nodes = [node("n1", 8, ready=False), node("n2", 2, {0})]
    with pytest.raises(DomainError) as err:
        place_restart(nodes, [LiveReplica("r", "n2", (0,))], 4, in_place=True)
    assert err.value.code == "no_room"


@given(
    counts=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    holders=st.lists(st.integers(0, 3), min_size=1, max_size=4),
    n=st.integers(1, 8),
    in_place=st.booleans(),
)
def test_placements_never_share_a_card_and_each_fits_its_node(counts, holders, n, in_place):
    nodes = [node(f"n{i}", c) for i, c in enumerate(counts)]
    replicas = []
    taken: dict[str, set[int]] = {}
    for j, h in enumerate(holders):
        target = nodes[h % len(nodes)]
        used = taken.setdefault(target.node, set())
        free = [i for i in target.indices if i not in used]
        if not free:
            continue
        used.add(free[0])
        replicas.append(LiveReplica(f"r{j}", target.node, (free[0],)))
    nodes = [
        NodeCards(c.node, True, c.indices, tuple(i for i in c.indices if i not in taken.get(c.node, set())))
        for c in nodes
    ]
    try:
        places = place_restart(nodes, replicas, n, in_place=in_place)
    except DomainError as err:
        assert err.code in {"no_room", "no_room_beside"} and "has no place" in err.message
        return
    assert [p.replica for p in places] == sorted(r.name for r in replicas)
    held: dict[str, set[int]] = {}
    for p in places:
        assert len(p.cards) == n and len(set(p.cards)) == n
        assert set(p.cards) <= set(next(c for c in nodes if c.node == p.node).indices)
        mine = held.setdefault(p.node, set())
        assert not mine & set(p.cards)  # two replacements never on one card
        mine |= set(p.cards)


def test_a_replacement_goes_on_cards_free_before_the_restart_rather_than_on_ones_an_earlier_step_frees():
    # One at a time: r1's replacement on card 2; then card 0 (r1's, freed) and card 3 are free. On
    # card 0, r2's step would wait for r1's old engine to exit; card 3 needs no wait.
    nodes = [node("n1", 4, {0, 1})]
    replicas = [LiveReplica("r1", "n1", (0,)), LiveReplica("r2", "n1", (1,))]
    places = place_restart(nodes, replicas, 1, in_place=True)
    assert [(p.replica, p.cards) for p in places] == [("r1", (2,)), ("r2", (3,))]
    # With no card free beside but the ones steps free, those are used, as before.
    tight = place_restart([node("n1", 3, {0, 1})], replicas, 1, in_place=True)
    assert [(p.replica, p.cards, p.in_place) for p in tight] == [("r1", (2,), False), ("r2", (0,), False)]
