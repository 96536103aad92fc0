"""Room on the nodes: beside the running replicas, or in place."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from base.errors import DomainError
from planning.room import room_for
from planning.types import NodeRoom, Room


def node(
    name: str, cards: int, free: int, own: int = 0, *, ready: bool = True, cls: str = "h100"
) -> NodeRoom:
    return NodeRoom(node=name, ready=ready, gpu_class=cls, cards=cards, free=free, own=own)


@pytest.mark.parametrize(
    ("nodes", "n", "running", "in_place", "expected"),
    [
        # room beside: rolling, and the nodes that fit
        ([node("a", 8, 4), node("b", 8, 2)], 4, True, False, Room(False, ("a",), ("a",))),
        # room beside wins over an in-place request
        ([node("a", 8, 4, 2)], 4, True, True, Room(False, ("a",), ("a",))),
        # nothing running: nothing to stop, so rolling even without room beside
        ([node("a", 8, 0)], 4, False, False, Room(False, (), ())),
        ([node("a", 8, 0)], 4, False, True, Room(False, (), ())),
        # room only once the model's own stop, and in place was asked for
        ([node("a", 8, 2, 2)], 4, True, True, Room(True, (), ("a",))),
        # a node that is not ready does not count, even with room
        ([node("a", 8, 8, ready=False), node("b", 8, 2, 2)], 4, True, True, Room(True, (), ("b",))),
        # another class does not count
        ([node("a", 8, 8, cls="a100"), node("b", 8, 4)], 4, True, False, Room(False, ("b",), ("b",))),
    ],
)
def test_room_for(nodes, n, running, in_place, expected):
    assert room_for(nodes, "h100", n, running=running, in_place=in_place) == expected


@pytest.mark.parametrize(
    ("nodes", "n", "running", "in_place", "code", "words"),
    [
        ([], 4, True, False, "no_class", "No ready node has h100 cards."),
        ([node("a", 8, 8, ready=False)], 4, True, False, "no_class", "No ready node has h100 cards."),
        ([node("a", 8, 8, cls="a100")], 4, True, False, "no_class", "No ready node has h100 cards."),
        (
            [node("a", 4, 4), node("b", 2, 2), node("c", 16, 16, ready=False)],
            8,
            True,
            False,
            "too_few_cards",
            "No node has 8 h100 cards; the most one has is 4.",
        ),
        # too few cards is said even with nothing running
        ([node("a", 4, 4)], 8, False, False, "too_few_cards", "the most one has is 4"),
        (
            [node("a", 8, 3, 0), node("b", 8, 1, 2)],
            4,
            True,
            True,
            "no_room",
            "No node has 4 h100 cards free, even with this model's own replicas stopped (3 at most are free now)",
        ),
        (
            [node("a", 8, 2, 2)],
            4,
            True,
            False,
            "no_room_beside",
            "No node has 4 h100 cards free beside the running replicas (2 at most are free now)",
        ),
    ],
)
def test_room_for_refuses(nodes, n, running, in_place, code, words):
    with pytest.raises(DomainError) as caught:
        room_for(nodes, "h100", n, running=running, in_place=in_place)
    assert caught.value.code == code
    assert caught.value.status == 409
    assert words in caught.value.message


def test_no_room_beside_says_what_in_place_costs():
    with pytest.raises(DomainError) as caught:
        room_for([node("a", 8, 2, 2)], "h100", 4, running=True, in_place=False)
    assert "Restarting in place stops each replica" in caught.value.message
    assert "does not answer while the new one loads" in caught.value.message


def test_no_room_says_other_models_hold_the_cards():
    with pytest.raises(DomainError) as caught:
        room_for([node("a", 8, 1, 1)], "h100", 4, running=True, in_place=True)
    assert "other models hold them" in caught.value.message
    assert "Free 4 on one node (move or stop another model's replica there" in caught.value.message


def test_each_refusal_of_room_says_the_next_step():
    """What to do, beside what is in the way: the class's nodes, the most cards, the room."""
    with pytest.raises(DomainError) as no_class:
        room_for([node("a", 8, 8, ready=False)], "h100", 4, running=True, in_place=False)
    assert "Uncordon a node of that class (or wait until its agent answers)" in no_class.value.message
    with pytest.raises(DomainError) as too_few:
        room_for([node("a", 4, 4)], "h100", 8, running=False, in_place=False)
    assert too_few.value.message.endswith("Ask for 4 or fewer, or add a node with 8.")


NODES = st.lists(
    st.tuples(
        st.integers(1, 8),
        st.integers(0, 8),
        st.integers(0, 8),
        st.booleans(),
        st.sampled_from(["h100", "a100"]),
    ),
    max_size=5,
).map(
    lambda rows: [
        node(f"n{i}", cards, min(free, cards), min(own, cards - min(free, cards)), ready=ready, cls=cls)
        for i, (cards, free, own, ready, cls) in enumerate(rows)
    ]
)


@given(NODES, st.integers(1, 8), st.booleans(), st.booleans())
def test_room_for_never_answers_in_place_when_there_is_room_beside(nodes, n, running, in_place):
    try:
        room = room_for(nodes, "h100", n, running=running, in_place=in_place)
    except DomainError:
        return
    beside = any(r.ready and r.gpu_class == "h100" and r.free >= n for r in nodes)
    if beside or not running:
        assert room.in_place is False
    if room.in_place:
        assert in_place and running and not room.beside and room.in_place_nodes
