"""A resize beyond one node's cards, planned across nodes, through the API's dry run: Llama-3.1-405B
in bf16 (its real config.json) on nodes of 8 h100-80g cards — two free nodes for 16 cards; 24 cards
refused on nodes of mixed classes or fabric domains, naming the rank with no place; room refused
when too few whole nodes are free; and a group replica's restart placing every rank."""

from __future__ import annotations

import pytest
from django.utils import timezone

from catalog.modelfiles import shape_from_config
from catalog.models import Node, Profile, ServedModel, Shard
from planning.types import SHAPE_FIELDS
from tests.catalog.modelfiles_support import index, load
from tests.operations.resize_api_support import client_for, resizer, saved_state
from tests.support import builders as b

pytestmark = pytest.mark.django_db

# metadata.total_size of the checkpoint's index: derived (parameters x 2 bytes), as
# tests/fixtures/hf-configs/README.md (the shared fixtures' README) says; the Hub's own figure was not read.
WEIGHTS_405B = 811706777600


CONTEXT_FLAG = {"vllm": "--max-model-len", "sglang": "--context-length", "trtllm": "--max_seq_len"}
TEXT_FIELDS = {"dtype", "attention", "expert_format"}  # the catalog keeps an unknown one as ""


def llama_405b(engine: str = "vllm", gpus: int = 8, **fields) -> Profile:
    """Llama-3.1-405B as its config.json and index describe it, with one profile on h100-80g cards
    serving 32768 tokens of context."""
    shape = shape_from_config(load("meta-llama__Llama-3.1-405B"), index=index(WEIGHTS_405B))
    figures = {f: getattr(shape, f) for f in SHAPE_FIELDS}
    figures.update({f: figures[f] or "" for f in TEXT_FIELDS})
    model = ServedModel.objects.create(
        name="llama-405b", source="meta-llama/Llama-3.1-405B", context_length=shape.context_length, **figures
    )
    args = [CONTEXT_FLAG[engine], "32768"]
    return b.profile(model, "h100", engine=engine, gpus=gpus, args=args, **fields)


def node(name: str, domain: str, *, cls=None) -> Node:
    n = b.node(name, cards=8, cls=cls)
    n.fabric_domain = domain
    n.save(update_fields=["fabric_domain"])
    return n


@pytest.fixture
def client():
    return client_for(resizer())


@pytest.fixture
def dry_run(client):
    def run(body: dict, kind: str = "gpus"):
        return client.post(f"/api/models/llama-405b/{kind}/", {**body, "dry_run": True}, format="json")

    return run


def test_16_cards_of_405b_bf16_go_on_two_free_nodes_as_two_pipeline_stages_of_tp_8(dry_run):
    llama_405b()
    node("gpu-1", "ib-1")
    node("gpu-2", "ib-1")
    node("gpu-3", "")  # in no fabric domain: joins no group
    before = saved_state()
    response = dry_run({"gpus": 16})
    assert response.status_code == 200, response.content
    body = response.json()
    assert saved_state() == before
    assert (body["before"], body["after"], body["nodes"]) == (8, 16, 2)
    assert body["room"]["beside"] == ["gpu-1", "gpu-2"]
    # vLLM: TP = a node's cards, PP = nodes; the launch gives TP 8 (the rank flags are each rank's).
    launch = body["launch"]
    assert launch[launch.index("--tensor-parallel-size") + 1] == "8"
    # 126 layers, 63 a stage; the embedding on rank 0, the head on rank 1.
    stages = body["stages"]
    assert [(s["stage"], s["first_layer"], s["layers"]) for s in stages] == [(0, 0, 63), (1, 63, 63)]
    assert stages[0]["holds"] == "layers 0-62 with the embedding"
    assert stages[1]["holds"] == "layers 63-125 with the output head"
    # Each card of a stage: (811706777600 - 2 x 128256 x 16384 x 2) / 2 decoder bytes / 8 + one
    # vocabulary matrix / 8, the same on both (the embedding and the head are one size).
    embedding = 128256 * 16384 * 2
    each = -(-((811706777600 - 2 * embedding) // 2 + embedding) // 8)
    assert abs(stages[0]["memory"]["weights"] - each) <= 1 and abs(stages[1]["memory"]["weights"] - each) <= 1
    # KV: 126 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 516096 a token; a stage's 63
    # layers keep half, split over 8 cards by KV head: 32256 bytes a token, 32768 tokens.
    assert stages[0]["memory"]["kv"] == 32256 * 32768
    assert all(s["memory"]["fits"] for s in stages)
    assert "the fullest of 2 pipeline stages" in body["per_card"]


def test_24_cards_on_nodes_of_mixed_classes_are_refused_naming_the_rank_and_the_class(dry_run):
    llama_405b()
    node("gpu-1", "ib-1")
    node("gpu-2", "ib-1")
    node("gpu-3", "ib-1", cls=b.gpu_class("a100-80g", 81920, 73728, "8.0"))
    before = saved_state()
    response = dry_run({"gpus": 24})
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "too_few_cards"
    assert "rank 2 of 3 has no place" in body["detail"]
    assert "fabric domain ib-1 has 2 such nodes" in body["detail"]
    assert "gpu-3 has a100-80g cards, not h100-80g (class)" in body["detail"]
    assert body["change"]["nodes"] == 3
    assert saved_state() == before


def test_24_cards_on_nodes_of_mixed_fabric_domains_are_refused_naming_the_rank_and_the_fabric(dry_run):
    llama_405b()
    node("gpu-1", "ib-1")
    node("gpu-2", "ib-1")
    node("gpu-3", "ib-2")
    node("gpu-4", "")
    response = dry_run({"gpus": 24})
    assert response.status_code == 409, response.content
    detail = response.json()["detail"]
    assert response.json()["code"] == "too_few_cards"
    assert "rank 2 of 3 has no place" in detail
    assert "gpu-3 is in fabric domain ib-2, not ib-1 (fabric)" in detail
    assert "gpu-4 has no fabric domain, so it joins no group (fabric)" in detail


def test_too_few_whole_nodes_free_is_refused_naming_the_rank_and_the_cards(dry_run):
    llama_405b()
    a, c = node("gpu-1", "ib-1"), node("gpu-3", "ib-1")
    node("gpu-2", "ib-1")
    small = b.profile(b.llama_8b("small"), "h100", gpus=1)
    b.replica(small, a, [0], name="small-1", port=8001)
    b.replica(small, c, [3], name="small-2", port=8002)
    response = dry_run({"gpus": 16})
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "no_room"
    assert "rank 1 of 2 has no place" in body["detail"]
    assert "gpu-1 has only 7 h100-80g cards free (cards)" in body["detail"]
    assert "gpu-3 has only 7 h100-80g cards free (cards)" in body["detail"]


def test_a_node_without_the_release_is_refused_naming_the_release(dry_run):
    p = llama_405b()
    p.engine_version = "0.21.0"
    p.save()
    good = {
        "driver_version": "580.65.06",
        "cuda_version": "13.0",
        "arch": "x86_64",
        "facts_at": timezone.now(),
    }
    for name, release in (("gpu-1", "0.21.0"), ("gpu-2", "0.20.2")):
        n = node(name, "ib-1")
        Node.objects.filter(pk=n.pk).update(engines={"vllm": release}, **good)
    response = dry_run({"gpus": 16})
    assert response.status_code == 409, response.content
    detail = response.json()["detail"]
    assert "rank 1 of 2 has no place" in detail
    assert "gpu-2" in detail and "0.20.2" in detail and "(release)" in detail


def test_the_nodes_asked_must_divide_the_cards_and_sglang_runs_tp_over_every_card(dry_run):
    llama_405b(engine="sglang")
    for i in range(1, 5):
        node(f"gpu-{i}", "ib-1")
    assert dry_run({"gpus": 32, "nodes": 3}).json()["code"] == "nodes_range"
    body = dry_run({"gpus": 32, "nodes": 4}).json()
    assert body["nodes"] == 4 and body["stages"] == []
    launch = body["launch"]
    assert launch[launch.index("--tp-size") + 1] == "32"  # TP over all four nodes' cards
    assert body["room"]["beside"] == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]


def test_an_engine_that_cannot_span_nodes_keeps_too_few_cards_with_its_reason(dry_run):
    llama_405b(engine="trtllm")
    node("gpu-1", "ib-1")
    node("gpu-2", "ib-1")
    body = dry_run({"gpus": 16}).json()
    assert body["code"] == "too_few_cards"
    assert "No node has 16 h100-80g cards; the most one has is 8" in body["detail"]
    assert "cannot run across nodes" in body["detail"] and "MPI world" in body["detail"]


def test_a_context_change_of_a_group_restarts_every_rank_beside_on_whole_free_nodes(dry_run):
    p = llama_405b(gpus=8, nodes=2, pp=2)
    nodes = [node(f"gpu-{i}", "ib-1") for i in range(1, 5)]
    r = b.replica(p, nodes[0], list(range(8)), name="llama-405b-1", port=8001)
    for card in nodes[1].cards.all():
        Shard.objects.create(replica=r, card=card, rank=1)
    body = dry_run({"tokens": 16384}, "context").json()
    assert body["room"]["places"] == [
        {
            "replica": "llama-405b-1",
            "in_place": False,
            "ranks": [
                {"rank": 0, "node": "gpu-3", "cards": list(range(8))},
                {"rank": 1, "node": "gpu-4", "cards": list(range(8))},
            ],
            "node": "gpu-3",
            "cards": list(range(8)),
        }
    ]
    assert len(body["stages"]) == 2


def test_a_group_without_room_beside_goes_in_place_when_asked(dry_run):
    p = llama_405b(gpus=8, nodes=2, pp=2)
    nodes = [node(f"gpu-{i}", "ib-1") for i in range(1, 3)]
    r = b.replica(p, nodes[0], list(range(8)), name="llama-405b-1", port=8001)
    for card in nodes[1].cards.all():
        Shard.objects.create(replica=r, card=card, rank=1)
    refused = dry_run({"tokens": 16384}, "context").json()
    assert refused["code"] == "no_room_beside"
    assert refused["detail"].startswith("llama-405b-1: rank 0 of 2 has no place")
    body = dry_run({"tokens": 16384, "in_place": True}, "context").json()
    (place,) = body["room"]["places"]
    assert place["in_place"] is True
    assert {(r["node"], tuple(r["cards"])) for r in place["ranks"]} == {
        ("gpu-1", tuple(range(8))),
        ("gpu-2", tuple(range(8))),
    }


def test_the_gpus_command_plans_across_the_nodes_it_is_given():
    from io import StringIO

    from django.core.management import call_command

    llama_405b()
    for i in range(1, 5):
        node(f"gpu-{i}", "ib-1")
    out = StringIO()
    call_command("gpus", "llama-405b", "32", "--nodes", "4", "--dry-run", stdout=out)
    assert "8 → 32 card(s)" in out.getvalue() and "across 4 nodes, a rank on each" in out.getvalue()


@pytest.mark.parametrize(
    ("engine", "told"),
    [
        # vLLM: TP within a node, the nodes as pipeline stages (the policy's rank flags carry the PP).
        ("vllm", ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--nnodes", "2"]),
        # SGLang: one TP group over every card of every node.
        ("sglang", ["--tp-size", "16", "--nnodes", "2"]),
    ],
)
def test_each_ranks_spec_tells_the_engine_its_own_widths(engine, told):
    from operations.services.specs import rank_specs

    profile = llama_405b(engine=engine, gpus=8, nodes=2)
    a, c = node("gpu-a", "ib-1"), node("gpu-c", "ib-1")
    specs = rank_specs(
        profile, [(0, a, list(range(8))), (1, c, list(range(8)))], port=8100, rendezvous_port=8101
    )
    for rank, spec in specs.items():
        args = spec["args"]
        for flag, value in zip(told[::2], told[1::2], strict=True):
            assert args[args.index(flag) + 1] == value, (engine, rank, flag, args)
        assert spec["group"] == {"rank": rank, "size": 2, "address": a.agent_host, "port": 8101}
