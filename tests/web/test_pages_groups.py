"""A replica across nodes on the pages: the nodes grid and the model page show its ranks across its
nodes (the model's one colour, each rank numbered), and the resize preview lists every rank's place."""

from __future__ import annotations

import re

import pytest

from catalog.models import Node, Shard
from tests.support import builders as b
from tests.web.pages_support import HX

pytestmark = pytest.mark.django_db


def fabric_node(name: str, domain: str = "ib-1") -> Node:
    n = b.node(name, cards=8)
    n.fabric_domain = domain
    n.save(update_fields=["fabric_domain"])
    return n


def group_of_two():
    """llama across gpu-1 (rank 0) and gpu-2 (rank 1), 4 cards each."""
    p = b.profile(b.llama_8b(), "h100", gpus=4, nodes=2, pp=2, args=["--max-model-len", "32768"])
    a, c = fabric_node("gpu-1"), fabric_node("gpu-2")
    r = b.replica(p, a, [0, 1, 2, 3], name="llama-3.1-8b-1", port=8001)
    r.rendezvous_port = 8002
    r.save(update_fields=["rendezvous_port"])
    for card in c.cards.filter(index__in=[4, 5, 6, 7]):
        Shard.objects.create(replica=r, card=card, rank=1)
    return p, r


def test_the_nodes_grid_numbers_a_groups_ranks_in_the_models_colour(viewer):
    group_of_two()
    page = viewer.get("/nodes/").content.decode()
    tiles = re.findall(r'<li class="card held (hue-\d+) group">.*?</li>', page)
    assert len(tiles) == 8 and len(set(tiles)) == 1  # one colour for every rank's cards
    assert page.count(">rank 0</span>") == 4 and page.count(">rank 1</span>") == 4
    assert "llama-3.1-8b-1 runs across nodes: rank 1 of its group" in page
    compact = viewer.get("/nodes/?view=compact").content.decode()
    assert compact.count(", llama-3.1-8b-1 rank 1") == 4


def test_a_replica_on_one_node_is_not_numbered(viewer):
    b.replica(b.profile(b.llama_8b(), "h100", gpus=2), b.node("gpu-1"), [0, 1])
    page = viewer.get("/nodes/").content.decode()
    assert ">rank 0</span>" not in page and " group" not in page


def test_the_model_page_lists_a_groups_ranks_across_its_nodes(viewer):
    group_of_two()
    page = viewer.get("/models/llama-3.1-8b/").content.decode()
    assert re.search(r'<span class="rank hue-\d+">rank 0</span> <a href="/nodes/gpu-1/">gpu-1</a>', page)
    assert re.search(r'<span class="rank hue-\d+">rank 1</span> <a href="/nodes/gpu-2/">gpu-2</a>', page)
    assert "rank 0: 4 cards (#0, #1, #2, #3); rank 1: 4 cards (#4, #5, #6, #7)" in page


def test_the_resize_preview_lists_every_ranks_place(operator):
    group_of_two()
    fabric_node("gpu-3")
    fabric_node("gpu-4")
    response = operator.post(
        "/models/llama-3.1-8b/context/preview/", {"tokens": "16384", "profile": "h100"}, **HX
    )
    assert response.status_code == 200
    text = response.content.decode()
    assert "<th>Rank</th>" in text
    rows = re.findall(r"<tr>(.*?)</tr>", text.split('<table class="places">')[1].split("</table>")[0])
    # Best fit: the group's own nodes' free halves (4 free each) before the whole free gpu-3 and gpu-4.
    assert [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows[1:]] == [
        ["llama-3.1-8b-1", "0", "gpu-1", "4 cards (#4, #5, #6, #7)", "beside: starts first"],
        ["1", "gpu-2", "4 cards (#0, #1, #2, #3)"],
    ]
    assert "2 ranks, one a node, 4 cards each: a pipeline stage each" in text


def test_a_resize_preview_across_nodes_names_the_nodes_a_first_replica_takes(operator):
    b.profile(b.llama_8b(), "h100", gpus=4, args=["--max-model-len", "32768"])
    fabric_node("gpu-1")
    fabric_node("gpu-2")
    response = operator.post("/models/llama-3.1-8b/resize/preview/", {"gpus": "16", "profile": "h100"}, **HX)
    text = response.content.decode()
    assert (
        "A replica across 2 nodes of one fabric domain, a rank on each: <strong>gpu-1, gpu-2</strong>" in text
    )
    assert "Apply: 16 cards" in text


def test_the_resize_form_may_name_the_nodes(operator):
    b.profile(b.llama_8b(), "h100", gpus=4, args=["--max-model-len", "32768"])
    for i in range(1, 5):
        fabric_node(f"gpu-{i}")
    body = {"gpus": "16", "nodes": "4", "profile": "h100"}
    text = operator.post("/models/llama-3.1-8b/resize/preview/", body, **HX).content.decode()
    assert "4 ranks, one a node, 4 cards each" in text
    assert "<strong>gpu-1, gpu-2, gpu-3, gpu-4</strong>" in text
    refused = operator.post("/models/llama-3.1-8b/resize/preview/", {**body, "nodes": "3"}, **HX)
    assert "do not split evenly over 3 nodes" in refused.content.decode()
