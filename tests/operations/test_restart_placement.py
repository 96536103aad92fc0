"""Where a replacement goes: best fit, but never beside the model's other replicas when it can help it."""

from __future__ import annotations

import pytest

from operations.services.placement import best_fit
from tests.support import builders as b

pytestmark = pytest.mark.django_db


def test_best_fit_packs_onto_the_node_with_the_fewest_free_cards_that_still_fit():
    b.node("gpu-a", cards=8)
    tight = b.node("gpu-b", cards=8)
    filler = b.profile(b.llama_8b("filler"), gpus=6)
    b.replica(filler, tight, [0, 1, 2, 3, 4, 5], name="filler-1")
    p = b.profile(b.llama_8b(), gpus=2)
    node, cards = best_fit(p)
    assert (node, [c.index for c in cards]) == (tight, [6, 7])


def test_a_replacement_avoids_the_nodes_that_hold_the_models_other_replicas():
    a, other = b.node("gpu-a", cards=8), b.node("gpu-b", cards=8)
    p = b.profile(b.llama_8b(), gpus=1)
    old = b.replica(p, a, [0], name="llama-1", port=8001)
    b.replica(p, other, [0], name="llama-2", port=8002)
    # gpu-b has fewer free cards, but llama-2 runs there: one node down would take both.
    b.replica(b.profile(b.llama_8b("filler")), other, [1, 2, 3], name="filler-1")
    node, _ = best_fit(p, replacing=old)
    assert node == a


def test_it_still_doubles_up_when_no_other_node_has_room():
    a, other = b.node("gpu-a", cards=1), b.node("gpu-b", cards=4)
    p = b.profile(b.llama_8b(), gpus=1)
    old = b.replica(p, a, [0], name="llama-1", port=8001)
    b.replica(p, other, [0], name="llama-2", port=8002)
    node, cards = best_fit(p, replacing=old)
    assert node == other and cards[0].index == 1


def test_no_room_anywhere_is_none():
    a = b.node("gpu-a", cards=2)
    p = b.profile(b.llama_8b(), gpus=2)
    b.replica(p, a, [0, 1])
    assert best_fit(p) is None
