"""Where a replica across nodes goes in the run: whole nodes of one fabric domain, a rank a node, and
ports free on every host it touches."""

from __future__ import annotations

import pytest
from django.conf import settings

from catalog.models import Node, Shard
from operations.services.placement import (
    best_fit,
    free_port,
    group_best_fit,
    group_ports,
    replica_placement,
    replica_ranks,
)
from tests.support import builders as b

pytestmark = pytest.mark.django_db


def fabric_node(name: str, domain: str, *, cards: int = 8, host: str = "127.0.0.1", cls=None) -> Node:
    n = b.node(name, cards=cards, agent_url=f"http://{host}:9", cls=cls)
    n.fabric_domain = domain
    n.save(update_fields=["fabric_domain"])
    return n


def group_profile(gpus_per_node: int = 8, nodes: int = 2):
    return b.profile(b.llama_8b("big"), gpus=gpus_per_node, nodes=nodes, pp=nodes)


def test_a_group_takes_whole_free_nodes_of_one_domain_rank_0_first():
    fabric_node("gpu-a", "ib-1")
    fabric_node("gpu-b", "ib-1")
    fabric_node("gpu-c", "")  # no domain: joins no group
    p = group_profile()
    ranks = group_best_fit(p)
    assert ranks is not None
    assert [(rank, node.name, [c.index for c in cards]) for rank, node, cards in ranks] == [
        (0, "gpu-a", list(range(8))),
        (1, "gpu-b", list(range(8))),
    ]


def test_no_domain_with_enough_free_nodes_is_none():
    fabric_node("gpu-a", "ib-1")
    fabric_node("gpu-b", "ib-2")
    fabric_node("gpu-c", "")
    assert group_best_fit(group_profile()) is None


def test_a_node_with_a_card_held_is_not_whole_for_a_rank_of_eight():
    a = fabric_node("gpu-a", "ib-1")
    fabric_node("gpu-b", "ib-1")
    fabric_node("gpu-c", "ib-1")
    b.replica(b.profile(b.llama_8b("small")), a, [0], name="small-1")
    ranks = group_best_fit(group_profile())
    assert [node.name for _, node, _ in ranks or ()] == ["gpu-b", "gpu-c"]


def test_nodes_of_another_class_are_not_counted():
    fabric_node("gpu-a", "ib-1")
    fabric_node("gpu-b", "ib-1", cls=b.gpu_class("a100-80g", capability="8.0"))
    assert group_best_fit(group_profile()) is None


def test_a_groups_ports_are_free_on_every_host_it_touches():
    a = fabric_node("gpu-a", "ib-1", host="10.0.0.1")
    c = fabric_node("gpu-c", "ib-1", host="10.0.0.3")
    other = b.node("gpu-x", cards=2, agent_url="http://10.0.0.3:9")  # shares gpu-c's host
    base = settings.LLMGW_REPLICA_PORT_BASE
    b.replica(b.profile(b.llama_8b("small")), other, [0], name="small-1", port=base + 5)
    # gpu-a's host alone is free from the base; the group also touches 10.0.0.3, which holds base + 5.
    assert free_port(a) == base
    assert group_ports([a, c]) == (base + 6, base + 7)
    assert group_ports([a, c], after=base + 9) == (base + 10, base + 11)


def test_a_rendezvous_port_in_use_is_not_given_again_on_its_hosts():
    a = fabric_node("gpu-a", "ib-1", host="10.0.0.1")
    c = fabric_node("gpu-c", "ib-1", host="10.0.0.3")
    base = settings.LLMGW_REPLICA_PORT_BASE
    p = group_profile()
    r = b.replica(p, a, list(range(8)), name="big-1", port=base)
    r.rendezvous_port = base + 1
    r.save(update_fields=["rendezvous_port"])
    for card in c.cards.all():
        Shard.objects.create(replica=r, card=card, rank=1)
    assert free_port(c) == base + 2
    assert replica_placement(r)[0] == a
    assert [(rank, node.name, cards) for rank, node, cards in replica_ranks(r)] == [
        (0, "gpu-a", list(range(8))),
        (1, "gpu-c", list(range(8))),
    ]


def test_one_node_best_fit_is_unchanged_beside_a_group():
    fabric_node("gpu-a", "ib-1")
    p = b.profile(b.llama_8b(), gpus=2)
    node, cards = best_fit(p) or (None, [])
    assert node is not None and node.name == "gpu-a" and [c.index for c in cards] == [0, 1]
