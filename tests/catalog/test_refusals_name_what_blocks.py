"""A refused removal or card names what is in the way and says what to do next; nothing changes."""

from __future__ import annotations

import pytest

from audit.models import AuditEntry
from base.actor import Actor, acting_as
from base.errors import DomainError
from catalog.models import Card, Node, ServedModel, Shard
from catalog.services import catalog as services
from tests.support import builders as b

pytestmark = pytest.mark.django_db


@pytest.fixture
def held():
    node = b.node("gpu-1", cards=2)
    profile = b.profile(b.llama_8b())
    replica = b.replica(profile, node, [0], name="llama-1")
    return node, profile, replica


def test_removing_a_node_whose_cards_are_held_names_the_replicas_and_says_drain(held):
    node, _, _ = held
    before = AuditEntry.objects.count()
    with acting_as(Actor(via="cli", name="pytest")), pytest.raises(DomainError) as caught:
        services.node_delete(instance=node)
    assert caught.value.message == (
        "Node gpu-1 has cards held by replica llama-1: drain the node (its page, the API or "
        "`manage.py drain gpu-1`) to move them, then remove it."
    )
    assert Node.objects.filter(name="gpu-1").exists() and AuditEntry.objects.count() == before


def test_removing_a_model_with_live_replicas_names_them(held):
    with acting_as(Actor(via="cli", name="pytest")), pytest.raises(DomainError) as caught:
        services.model_delete(instance=ServedModel.objects.get())
    assert "has replica llama-1 not stopped: stop them first" in caught.value.message


def test_a_card_held_by_another_replica_names_it_and_the_way_out(held):
    node, profile, _ = held
    other = b.replica(profile, node, [1], name="llama-2")
    with acting_as(Actor(via="cli", name="pytest")), pytest.raises(DomainError) as caught:
        services.shard_save(instance=Shard(replica=other, card=Card.objects.get(node=node, index=0)))
    assert caught.value.message == (
        "Card gpu-1#0 is held by replica llama-1: choose a free card, or stop or move llama-1 first."
    )
    assert Shard.objects.filter(card__index=0).count() == 1
