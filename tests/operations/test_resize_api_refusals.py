"""POST /api/models/{name}/gpus/ and /context/: every refusal's status and sentence.

Every refused request is checked to have saved nothing and written no audit entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from catalog.models import Profile
from tests.operations.resize_api_support import (
    CHANGE_KEYS,
    client_for,
    context_url,
    gpus_url,
    llama_on_h100,
    resizer,
    saved_state,
)
from tests.support import builders as b

pytestmark = pytest.mark.django_db

GIB = 2**30
MIB = 2**20


# -- every refusal ------------------------------------------------------------------------------


def l4():
    return b.gpu_class("l4-24g", memory_mib=23034, usable_mib=20000, capability="8.9")


def declared_at_path():
    b.node("gpu-1")
    b.profile(b.llama_8b(declared=True, declared_in="/etc/llmgw/cluster.toml"), "h100")


def cpu_only_model():
    m = b.llama_8b()
    Profile.objects.create(model=m, name="cpu", engine="llamacpp", gpu_class=None)


def two_card_profiles():
    b.node("gpu-1")
    m = b.llama_8b()
    b.profile(m, "short", args=["--max-model-len", "8192"])
    b.profile(m, "long")
    Profile.objects.create(model=m, name="cpu", engine="llamacpp", gpu_class=None)


def freetoken_on(capability: str):
    def build():
        cls = b.gpu_class(f"card-{capability}", capability=capability)
        b.node("gpu-1", cls=cls)
        b.profile(
            b.llama_8b("gpt-oss-20b"),
            "ft",
            engine="freetoken",
            cls=cls,
            gpus=1,
            args=["--max-seq-len-override", "32768"],
        )

    return build


def too_big_for_one_l4():
    cls = l4()
    b.node("gpu-l", cards=4, cls=cls)
    b.profile(b.llama_8b(), "l4", cls=cls, gpus=2, args=["--max-model-len", "131072"])


def on_l4_with_long_context_on_one_card():
    cls = l4()
    b.node("gpu-l", cards=4, cls=cls)
    b.profile(b.llama_8b(), "l4", cls=cls, gpus=1, args=["--max-model-len", "8192"])


def no_node_of_its_class():
    b.node("gpu-1")
    b.profile(b.llama_8b(), "a100", cls=b.gpu_class("a100-40g", 40960, 36860, "8.0"))


def four_card_node_other_model_holds_two():
    n = b.node("gpu-1", cards=4)
    p = b.profile(b.llama_8b(), "h100", gpus=1)
    b.replica(p, n, [0])
    b.replica(b.profile(b.llama_8b("other"), "h100", gpus=2), n, [1, 2])


def four_card_node_model_holds_two():
    n = b.node("gpu-1", cards=4)
    b.replica(b.profile(b.llama_8b(), "h100", gpus=2), n, [0, 1])


def two_card_node_model_holds_both():
    n = b.node("gpu-1", cards=2)
    b.replica(b.profile(b.llama_8b(), "h100", gpus=2), n, [0, 1])


@dataclass
class Refusal:
    code: str
    status: int
    body: dict
    setup: Callable[[], object] = llama_on_h100
    url: str = gpus_url()
    says: tuple[str, ...] = ()  # what the sentence must name
    carries_change: bool = True
    change: dict = field(default_factory=dict)  # parts of "change" to check


REFUSALS = [
    Refusal(
        "not_found",
        404,
        {"gpus": 2},
        url=gpus_url("no-such-model"),
        says=("no-such-model",),
        carries_change=False,
    ),
    Refusal(
        "declared",
        409,
        {"gpus": 2},
        declared_at_path,
        says=("/etc/llmgw/cluster.toml", "sync_cluster_settings"),
        carries_change=False,
    ),
    Refusal("gpus_range", 400, {"gpus": 0}, says=("1 to 64",), carries_change=False),
    Refusal("gpus_range", 400, {"gpus": 65}, says=("1 to 64", "65"), carries_change=False),
    Refusal("gpus_range", 400, {"gpus": 10**30}, says=("1 to 64",), carries_change=False),
    Refusal("no_profile", 400, {"gpus": 2, "profile": "nope"}, says=("'nope'", "h100"), carries_change=False),
    Refusal("cpu_only", 400, {"gpus": 2}, cpu_only_model, says=("CPUs", "GPU class"), carries_change=False),
    Refusal(
        "cpu_only",
        400,
        {"gpus": 2, "profile": "cpu"},
        two_card_profiles,
        says=("cpu", "CPUs"),
        carries_change=False,
    ),
    Refusal(
        "ambiguous_profile",
        400,
        {"gpus": 2},
        two_card_profiles,
        says=("long", "short", "name one"),
        carries_change=False,
    ),
    Refusal("unchanged", 400, {"gpus": 1}, says=("already uses 1 card",), change={"before": 1, "after": 1}),
    Refusal(
        "capability",
        400,
        {"gpus": 2},
        freetoken_on("7.5"),
        url=gpus_url("gpt-oss-20b"),
        says=("8.0", "7.5", "freetoken"),
        change={"engine": "freetoken", "gpu_class": "card-7.5"},
    ),
    Refusal(
        "heads",
        400,
        {"gpus": 3},
        says=("8 KV heads", "32 attention heads", "1, 2, 4, 8, 16 or 32"),
        change={"after": 3},
    ),
    # On one node, as asked: tensor parallel 64 wide (across 8 nodes it would run TP 8, PP 8).
    Refusal("heads", 400, {"gpus": 64, "nodes": 1}, says=("32 attention heads", "64 cards")),
    Refusal(
        "layers",
        400,
        {"gpus": 64, "nodes": 64},
        says=("64 pipeline stages", "32 layers", "32 nodes or fewer"),
        change={"after": 64},
    ),
    Refusal("nodes_range", 400, {"gpus": 16, "nodes": 3}, says=("16 cards", "3 nodes", "1, 2, 4, 8 or 16")),
    Refusal(
        "single_node_engine",
        400,
        {"gpus": 2, "nodes": 2},
        freetoken_on("9.0"),
        url=gpus_url("gpt-oss-20b"),
        says=("freetoken engine cannot run across nodes", "one card"),
    ),
    Refusal(
        "single_card_engine",
        400,
        {"gpus": 2},
        freetoken_on("9.0"),
        url=gpus_url("gpt-oss-20b"),
        says=("one card", "2 cards"),
    ),
    Refusal(
        "memory",
        400,
        {"gpus": 1},
        too_big_for_one_l4,
        # need 15.0 + 16.0 + 1.5 GiB against 20000 MiB, and both ways out
        says=(
            "32.3 GiB",
            "19.5 GiB usable",
            "more cards (2 cards would hold it)",
            "a shorter context",
            "at most 26400 tokens",
            "/api/models/llama-3.1-8b/context/",
        ),
        change={"before": 2, "after": 1, "per_card": "32.3 GiB on its 1 card, of 19.5 GiB usable"},
    ),
    Refusal("no_class", 409, {"gpus": 2}, no_node_of_its_class, says=("a100-40g",)),
    Refusal(
        "too_few_cards",
        409,
        {"gpus": 8},
        lambda: llama_on_h100(cards=4),
        says=("8 h100-80g cards", "the most one has is 4"),
    ),
    Refusal(
        "no_room",
        409,
        {"gpus": 4, "in_place": True},
        four_card_node_other_model_holds_two,
        says=("4 h100-80g cards free", "1 at most", "other models"),
    ),
    Refusal(
        "no_room_beside",
        409,
        {"gpus": 4},
        four_card_node_model_holds_two,
        says=("beside the running replicas", "2 at most", "Restarting in place"),
    ),
    # context
    Refusal("not_found", 404, {"tokens": 8192}, url=context_url("no-such-model"), carries_change=False),
    Refusal(
        "declared",
        409,
        {"tokens": 8192},
        declared_at_path,
        url=context_url(),
        says=("/etc/llmgw/cluster.toml",),
        carries_change=False,
    ),
    Refusal(
        "context_range",
        400,
        {"tokens": 0},
        url=context_url(),
        says=("1 to 131072 tokens",),
        carries_change=False,
    ),
    Refusal(
        "context_range",
        400,
        {"tokens": 131073},
        url=context_url(),
        says=("1 to 131072 tokens", "131073"),
        carries_change=False,
    ),
    Refusal(
        "context_range",
        400,
        {"tokens": 10**30},
        url=context_url(),
        says=("1 to 131072 tokens",),
        carries_change=False,
    ),
    Refusal(
        "ambiguous_profile", 400, {"tokens": 8192}, two_card_profiles, url=context_url(), carries_change=False
    ),
    Refusal(
        "unchanged",
        400,
        {"tokens": 32768},
        url=context_url(),
        says=("32768 tokens",),
        change={"kind": "context", "before": 32768},
    ),
    Refusal(
        "capability",
        400,
        {"tokens": 8192},
        freetoken_on("7.5"),
        url=context_url("gpt-oss-20b"),
        says=("8.0", "7.5"),
    ),
    Refusal(
        "memory",
        400,
        {"tokens": 131072},
        on_l4_with_long_context_on_one_card,
        url=context_url(),
        says=("32.3 GiB", "19.5 GiB usable", "more cards", "at most 26400 tokens"),
        change={"kind": "context", "before": 8192, "after": 131072},
    ),
    Refusal(
        "no_room_beside",
        409,
        {"tokens": 8192},
        two_card_node_model_holds_both,
        url=context_url(),
        says=("Restarting in place",),
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=lambda c: f"{c.url.rsplit('/', 2)[-2]}-{c.code}-{c.body}")
def test_each_refusal_answers_its_status_code_and_a_sentence_and_saves_nothing(case: Refusal):
    case.setup()
    before = saved_state()

    response = client_for(resizer()).post(case.url, case.body, format="json")

    assert response.status_code == case.status, response.content
    body = response.json()
    assert body["code"] == case.code
    detail = body["detail"]
    assert len(detail) > 20 and detail.endswith("."), detail  # a sentence
    for words in case.says:
        assert words in detail, (words, detail)
    if case.carries_change:
        assert set(body) == {"detail", "code", "change"}
        assert set(body["change"]) == CHANGE_KEYS
        assert body["change"]["model"] == case.url.split("/")[3]
        for key, value in case.change.items():
            assert body["change"][key] == value, (key, body["change"])
    else:
        assert set(body) == {"detail", "code"}
    assert saved_state() == before


def test_the_refusal_codes_cover_every_code_the_design_names():
    named = {
        "not_found",
        "declared",
        "gpus_range",
        "no_profile",
        "cpu_only",
        "ambiguous_profile",
        "unchanged",
        "capability",
        "heads",
        "single_card_engine",
        "memory",
        "no_class",
        "too_few_cards",
        "no_room",
        "no_room_beside",
        "context_range",
        "layers",
        "nodes_range",
        "single_node_engine",
    }  # and busy, in test_resize_concurrency
    assert {c.code for c in REFUSALS} == named


def test_a_memory_refusal_carries_the_figures_worked_out():
    too_big_for_one_l4()
    body = client_for(resizer()).post(gpus_url(), {"gpus": 1}, format="json").json()
    # vLLM's terms at TP 1 (engines.toml): outside PyTorch 0.35 GiB, CUDA
    # graphs 1 GiB; the builder's shape has no sizes for the activation peak.
    non_torch, graphs = round(0.35 * GIB), GIB
    weights, kv, overhead = 16_060_522_496, 131_072 * 131_072, non_torch + graphs
    memory = body["change"]["memory"]
    assert {
        k: memory[k] for k in ("cards", "weights", "kv", "overhead", "need", "budget", "context", "fits")
    } == {
        "cards": 1,
        "weights": weights,
        "kv": kv,
        "overhead": overhead,
        "need": weights + kv + overhead,
        "budget": 20_000 * MIB,  # the class's usable memory, below 0.9 of the 23034 MiB card
        "context": 131_072,
        "fits": False,
    }
    # each term in bytes beside them, and listed with how and where from
    assert (memory["non_torch"], memory["cuda_graph"], memory["activation"]) == (non_torch, graphs, 0)
    assert [t["name"] for t in memory["terms"]] == ["activation", "non_torch", "cuda_graph"]
    assert all(t["source"] for t in memory["terms"])
