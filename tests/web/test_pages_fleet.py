"""What the operator pages show of the fleet: a model, the models list and its filters, the htmx
fragments, the nodes and a node, a replica's memory planned and measured, and query counts that do not
grow with the fleet."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from catalog.models import Profile, ServedModel
from operations.models import RestartOperation
from tests.support import builders as b
from tests.web.pages_support import HX, fleet, llama_on_h100, operation, signed_in

pytestmark = pytest.mark.django_db


# -- pages and fragments ----------------------------------------------------------------------------------


def test_the_model_page_shows_shape_profiles_replicas_and_the_card_memory_bar(viewer):
    m = llama_on_h100()
    replica = m.profiles.get().replicas.get()
    Profile.objects.filter(model=m).update(revision=3)
    page = viewer.get("/models/llama-3.1-8b/").content.decode()
    assert "<dt>Weights</dt><dd>15.0 GiB</dd>" in page
    assert "<dt>KV cache per token</dt><dd>128 KiB</dd>" in page
    assert "<dt>Attention</dt><dd>GQA</dd>" in page
    assert "<dd>32 attention, 8 KV</dd>" in page and "<dt>Head size</dt><dd>128</dd>" in page
    assert "<dt>Context</dt><dd>131072 tokens</dd>" in page
    # The bar: weights, KV cache for the profile's context, overhead, against the usable 71.7 GiB.
    assert (
        'class="seg seg-weights' in page and 'class="seg seg-kv' in page and 'class="seg seg-overhead' in page
    )
    assert "weights 15.0 GiB" in page and "KV cache 4.0 GiB (32768 tokens)" in page
    # 14.96 + 4.0 + vLLM's terms at TP 1 (outside PyTorch 0.35, CUDA graphs 1), each its own segment
    assert "20.3 GiB per card of 71.7 GiB usable (28%)" in page
    assert "outside PyTorch 0.3 GiB" in page and "CUDA graphs 1.0 GiB" in page
    assert "Budget: 79.65 GiB x --gpu-memory-utilization 0.92, capped by the class" in page
    assert replica.name in page and 'href="/nodes/gpu-1/"' in page
    assert "stale: profile is at 3" in page


def test_the_models_list_counts_cards_in_use_and_stale_replicas():
    fleet(2)
    page = signed_in(b.user()).get("/").content.decode()
    assert page.count('<td class="num">4</td>') == 2  # cards in use: two replicas of two cards
    assert page.count('<span class="badge warn">1 stale</span>') == 2


@pytest.mark.parametrize(
    ("query", "shown", "hidden"),
    [
        ("q=model-01", ["model-01"], ["model-00"]),
        ("engine=llamacpp", ["mistral"], ["model-00"]),
        ("gpu_class=cpu", ["mistral"], ["model-00"]),
        ("gpu_class=h100-80g", ["model-00", "model-01"], ["mistral"]),
        ("state=declared", ["model-00"], ["model-01", "mistral"]),
        ("state=editable", ["model-01", "mistral"], ["model-00"]),
        ("stale=on", ["model-00", "model-01"], ["mistral"]),
    ],
)
def test_the_models_list_filters(query, shown, hidden):
    fleet(2)
    ServedModel.objects.filter(name="model-00").update(declared=True)
    b.profile(b.llama_8b("mistral"), "cpu", engine="llamacpp", cls=None)
    Profile.objects.filter(model__name="mistral").update(gpu_class=None)
    page = signed_in(b.user()).get(f"/?{query}", **HX).content.decode()
    for name in shown:
        assert f">{name}</strong>" in page
    for name in hidden:
        assert f">{name}</strong>" not in page


def test_an_htmx_request_gets_the_fragment_and_a_full_load_the_whole_page(viewer):
    fleet(1)
    fragment = viewer.get("/?q=model", **HX)
    assert fragment.status_code == 200
    assert b"<html" not in fragment.content and fragment.content.lstrip().startswith(
        b'<div id="model-results">'
    )
    assert "HX-Request" in fragment["Vary"]
    whole = viewer.get("/?q=model")
    assert (
        whole.content.lstrip().startswith(b"<!doctype html>") and b'<div id="model-results">' in whole.content
    )


def test_a_history_restore_gets_the_whole_page(viewer):
    fleet(1)
    response = viewer.get("/?q=model", HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert b"<html" in response.content


def test_the_nodes_page_shows_each_card_free_or_held_by_which_model(viewer):
    fleet(2)
    page = viewer.get("/nodes/").content.decode()
    assert "2 nodes, 16 cards, 8 free" in page
    assert page.count('class="card free"') == 8
    assert page.count('class="card held hue-') == 8
    assert '<a class="holder" href="/models/model-00/">model-00</a>' in page
    assert "8 × h100-80g" in page


def test_a_node_page_lists_its_replicas(viewer):
    fleet(2)
    page = viewer.get("/nodes/gpu-01/").content.decode()
    assert "model-01-1" in page and "model-01-2" in page and "model-00-1" not in page
    assert "stale: profile is at 2" in page
    assert viewer.get("/nodes/nowhere/").status_code == 404


# -- query counts -----------------------------------------------------------------------------------------


def count_queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("url", ["/", "/models/model-00/", "/nodes/", "/nodes/gpu-00/", "/operations/"])
def test_page_queries_do_not_grow_with_the_fleet(operator, django_assert_num_queries, url):
    fleet(2)
    operation(ServedModel.objects.get(name="model-00"))
    small = count_queries(operator, url)
    fleet_more = 8
    for i in range(2, 2 + fleet_more):
        n = b.node(f"gpu-{i:02d}")
        p = b.profile(b.llama_8b(f"model-{i:02d}"), "h100", gpus=2)
        b.replica(p, n, [0, 1], name=f"model-{i:02d}-1", port=8000 + i)
    m = ServedModel.objects.get(name="model-00")
    p = m.profiles.get()
    for j in range(4):  # the model on the page gets more replicas and restarts too
        b.replica(p, b.node(f"gpu-x{j}"), [0, 1], name=f"model-00-x{j}", port=7000 + j)
    RestartOperation.objects.update(state="succeeded")
    operation(m)
    with django_assert_num_queries(small):
        assert operator.get(url).status_code == 200


# -- a replica: planned and measured ---------------------------------------------------------------


def test_the_replica_page_shows_planned_and_measured_side_by_side(viewer):
    m = llama_on_h100()
    replica = m.profiles.get().replicas.get()
    GIB = 2**30
    replica.measured_memory = {
        "weights": round(14.96 * GIB),
        "non_torch": round(0.30 * GIB),
        "activation": round(1.26 * GIB),
        "kv_cache": round(53.29 * GIB),
        "sequences": 13.0,
        "kv_tokens": 436_000,
    }
    replica.save()
    page = viewer.get(f"/replicas/{replica.name}/").content.decode()
    assert "Memory per card: planned and measured" in page
    assert "its profile as planned now" in page
    # weights: planned 16060522496 bytes (14.96 GiB) beside the 14.96 logged
    assert (
        '<td>weights</td><td class="num planned">14.96 GiB</td><td class="num measured">14.96 GiB</td>'
        in page
    )
    # outside PyTorch: planned 0.35 GiB at TP 1, logged 0.30
    assert (
        '<td class="num planned">0.35 GiB</td><td class="num measured">0.30 GiB</td><td class="num">+16.7%</td>'
        in page
    )
    assert "436,000" in page
    # the model page links to it, with the need planned beside the need measured (the terms logged)
    model_page = viewer.get("/models/llama-3.1-8b/").content.decode()
    assert f'href="/replicas/{replica.name}/"' in model_page
    # over the terms logged: planned weights 14.96 + KV 4 (the profile's 32768 tokens x 128 KiB)
    # + activation 0 (the shape has no sizes) + outside PyTorch 0.35; measured 14.96 + 53.29 / 13
    # sequences + 1.26 + 0.30
    assert "19.31 / 20.62 GiB (-6.4%)" in model_page


def test_a_replica_that_reported_nothing_says_so(viewer):
    m = llama_on_h100()
    replica = m.profiles.get().replicas.get()
    page = viewer.get(f"/replicas/{replica.name}/").content.decode()
    assert "not reported yet" in page
    assert viewer.get("/replicas/no-such/").status_code == 404


def test_the_replica_page_shows_each_rank_a_missing_line_and_the_drift_per_release(viewer):
    m = llama_on_h100()
    replica = m.profiles.get().replicas.get()
    GIB = 2**30
    rank = {"weights": round(7.48 * GIB), "kv_cache": round(61.41 * GIB), "activation": round(2.05 * GIB)}
    replica.measured_memory = {
        **rank,
        "card_bytes": round(70.1 * GIB),
        "ranks": {"0": rank, "1": {**rank, "kv_cache": round(61.0 * GIB)}},
        "missing": ["sequences", "cuda_graph"],
    }
    replica.planned_memory = {
        "weights": round(7.48 * GIB),
        "activation": round(2.2 * GIB),
        "need": round(20 * GIB),
        "release": "0.19.0",
        "terms_of": "vLLM 0.11 to 0.20 (V1 engine)",
    }
    replica.save()
    page = viewer.get(f"/replicas/{replica.name}/").content.decode()
    assert "Each rank, as its engine reported it" in page
    assert '<tr><td>1</td><td class="num">7.48 GiB</td><td class="num">61.00 GiB</td>' in page
    assert "The engine did not print its concurrency, CUDA graphs at start-up" in page
    assert "Planned for release 0.19.0, by the memory terms of vLLM 0.11 to 0.20 (V1 engine)." in page
    assert "Drift, per engine and release" in page and "vllm, 0.19.0: " in page
    # the model page: the need beside the need measured, what the card holds, and the missing lines
    model_page = viewer.get("/models/llama-3.1-8b/").content.decode()
    assert "70.10 GiB held on the card" in model_page
    assert "the engine did not print: concurrency, CUDA graphs" in model_page
