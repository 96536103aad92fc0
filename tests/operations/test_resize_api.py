"""POST /api/models/{name}/gpus/ and /context/: every refusal's status and sentence, access, bad input.

Every refused request is checked to have saved nothing and written no audit entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from rest_framework.test import APIClient

from audit.models import AuditEntry
from catalog.models import Profile
from tests.support import builders as b

pytestmark = pytest.mark.django_db

GIB = 2**30
MIB = 2**20
DESIGN_KEYS = {
    "model",
    "profile",
    "engine",
    "gpu_class",
    "before",
    "after",
    "args",
    "per_card",
    "restarted",
    "in_place",
    "note",
}
CHANGE_KEYS = DESIGN_KEYS | {"memory", "room", "kind", "operation", "launch"}


def client_for(user=None) -> APIClient:
    c = APIClient()
    if user is not None:
        c.force_authenticate(user)
    return c


def user(name: str = "someone", *perms: str):
    """A user without a password: nothing here signs in by password, and hashing one is slow."""
    u = get_user_model().objects.create_user(username=name, password=None)
    u.user_permissions.add(
        *(
            Permission.objects.get(content_type__app_label=p.split(".")[0], codename=p.split(".")[1])
            for p in perms
        )
    )
    return u


def resizer(name: str = "alice"):
    return user(name, "catalog.resize_model")


def gpus_url(model: str = "llama-3.1-8b") -> str:
    return f"/api/models/{model}/gpus/"


def context_url(model: str = "llama-3.1-8b") -> str:
    return f"/api/models/{model}/context/"


def saved_state() -> list[tuple]:
    """Every profile as it runs, and how many audit entries: what a refusal must leave alone."""
    rows = Profile.objects.order_by("pk").values_list(
        "gpus_per_node", "tp", "nodes", "pp", "args", "env", "revision"
    )
    return [*map(tuple, rows), ("audit", AuditEntry.objects.count())]


def llama_on_h100(gpus: int = 1, args: list[str] | None = None, cards: int = 8):
    b.node("gpu-1", cards=cards)
    return b.profile(b.llama_8b(), "h100", gpus=gpus, args=args or ["--max-model-len", "32768"])


# -- success ------------------------------------------------------------------------------------


def test_a_resize_answers_the_change_with_the_design_keys_and_writes_one_audit_entry():
    p = llama_on_h100(gpus=1, args=["--max-model-len", "32768", "--tensor-parallel-size=1"])
    alice = resizer()
    response = client_for(alice).post(gpus_url(), {"gpus": 2}, format="json", HTTP_X_REQUEST_ID="req-42")

    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == CHANGE_KEYS
    assert {
        k: body[k]
        for k in (
            "model",
            "profile",
            "engine",
            "gpu_class",
            "before",
            "after",
            "args",
            "restarted",
            "in_place",
            "kind",
        )
    } == {
        "model": "llama-3.1-8b",
        "profile": "h100",
        "engine": "vllm",
        "gpu_class": "h100-80g",
        "before": 1,
        "after": 2,
        "args": ["--max-model-len", "32768"],
        "restarted": 0,
        "in_place": False,
        "kind": "gpus",
    }
    # 16060522496 / 2 + 131072 x 32768 / 2 + vLLM's terms at TP 2 on an 80 GiB
    # card: outside PyTorch 0.35, NVLink buffers 1.8, CUDA graphs 1 GiB.
    assert body["per_card"] == "12.6 GiB on each of 2 cards, of 71.7 GiB usable on each"
    assert body["room"] == {
        "in_place": False,
        "beside": ["gpu-1"],
        "beside_count": 1,
        "in_place_nodes": ["gpu-1"],
        "in_place_count": 1,
        "places": [],  # no replica runs, so nothing is restarted
    }

    p.refresh_from_db()
    assert (p.tp, p.gpus_per_node, p.revision) == (2, 2, 2)
    (entry,) = AuditEntry.objects.all()
    assert (entry.via, entry.user, entry.actor, entry.action, entry.request_id) == (
        "api",
        alice,
        "alice",
        "resize",
        "req-42",
    )
    assert (entry.before["tp"], entry.after["tp"]) == (1, 2)
    assert (entry.before["gpus_per_node"], entry.after["gpus_per_node"]) == (1, 2)
    assert (entry.before["revision"], entry.after["revision"]) == (1, 2)
    assert entry.before["args"] == ["--max-model-len", "32768", "--tensor-parallel-size=1"]
    assert entry.after["args"] == ["--max-model-len", "32768"]


def test_a_resize_with_a_token_is_audited_as_the_tokens_user():
    llama_on_h100(gpus=1)
    bot = resizer("bot")
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {b.token(bot)}")
    assert c.post(gpus_url(), {"gpus": 4}, format="json").status_code == 200
    (entry,) = AuditEntry.objects.exclude(object_type="token")
    assert (entry.user, entry.via) == (bot, "api")


def test_a_dry_run_answers_the_change_and_saves_nothing():
    llama_on_h100(gpus=1)
    c = client_for(resizer())
    before = saved_state()
    preview = c.post(gpus_url(), {"gpus": 2, "dry_run": True}, format="json")
    assert preview.status_code == 200
    assert saved_state() == before

    done = c.post(gpus_url(), {"gpus": 2}, format="json")
    assert preview.json() == done.json()
    assert saved_state() != before


def test_a_context_change_answers_tokens_before_and_after_and_is_audited():
    p = llama_on_h100(gpus=1, args=["--max-model-len", "32768", "--enable-prefix-caching"])
    response = client_for(resizer()).post(context_url(), {"tokens": 65536}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == CHANGE_KEYS
    assert (body["kind"], body["before"], body["after"]) == ("context", 32768, 65536)
    assert body["args"] == ["--enable-prefix-caching", "--max-model-len", "65536"]
    assert body["memory"]["kv"] == 65536 * 131072 and body["memory"]["context"] == 65536
    p.refresh_from_db()
    assert (p.args, p.revision) == (body["args"], 2)
    (entry,) = AuditEntry.objects.all()
    assert (entry.action, entry.via, entry.after["args"]) == ("set_context", "api", body["args"])


def test_in_place_resize_answers_in_place_when_only_the_models_own_cards_make_room():
    n = b.node("gpu-1", cards=4)
    p = b.profile(b.llama_8b(), "h100", gpus=2)
    b.replica(p, n, [0, 1])
    response = client_for(resizer()).post(gpus_url(), {"gpus": 4, "in_place": True}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["in_place"] is True
    assert response.json()["restarted"] == 1
    from operations.models import RestartOperation

    assert RestartOperation.objects.get(pk=response.json()["operation"]).in_place is True


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
    Refusal("heads", 400, {"gpus": 64}, says=("32 attention heads", "64 cards")),
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


# -- access --------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, body", [(gpus_url(), {"gpus": 2}), (context_url(), {"tokens": 8192})])
def test_anonymous_requests_are_refused_with_the_error_shape_and_change_nothing(url, body):
    llama_on_h100()
    before = saved_state()
    response = APIClient().post(url, body, format="json")
    assert response.status_code in (401, 403)
    assert response.json()["code"] == "not_authenticated"
    assert "credentials" in response.json()["detail"].lower()
    assert saved_state() == before


@pytest.mark.parametrize("url, body", [(gpus_url(), {"gpus": 2}), (context_url(), {"tokens": 8192})])
def test_signed_in_without_the_resize_permission_is_forbidden_and_changes_nothing(url, body):
    llama_on_h100()
    before = saved_state()
    # Being able to edit profiles is not being able to resize.
    response = client_for(user("bob", "catalog.change_profile")).post(url, body, format="json")
    assert response.status_code == 403
    assert response.json() == {
        "detail": "You need the permission 'Can resize a model or change its context' "
        "(catalog.resize_model): the operator role gives it.",
        "code": "permission_denied",
    }
    assert saved_state() == before


def test_even_a_dry_run_needs_the_resize_permission():
    llama_on_h100()
    response = client_for(user("bob")).post(gpus_url(), {"gpus": 2, "dry_run": True}, format="json")
    assert response.status_code == 403


@pytest.mark.parametrize("url, body", [(gpus_url(), {"gpus": 2}), (context_url(), {"tokens": 8192})])
def test_signed_in_with_the_resize_permission_works(url, body):
    llama_on_h100()
    response = client_for(resizer()).post(url, body, format="json")
    assert response.status_code == 200, response.content
    assert AuditEntry.objects.get().user.username == "alice"


def test_the_resize_permission_through_a_group_works_too():
    llama_on_h100()
    group = Group.objects.create(name="operators")
    group.permissions.add(Permission.objects.get(codename="resize_model"))
    carol = user("carol")
    carol.groups.add(group)
    assert client_for(carol).post(gpus_url(), {"gpus": 2}, format="json").status_code == 200


# -- bad input -----------------------------------------------------------------------------------

BAD_GPUS = [
    ({"gpus": "4"}, "gpus", "whole number"),
    ({"gpus": 4.5}, "gpus", "whole number"),
    ({"gpus": 4.0}, "gpus", "whole number"),
    ({"gpus": True}, "gpus", "true/false"),
    ({"gpus": None}, "gpus", "null"),
    ({"gpus": [4]}, "gpus", "whole number"),
    ({"gpus": {"n": 4}}, "gpus", "whole number"),
    ({}, "gpus", "required"),
    ({"profile": "h100"}, "gpus", "required"),
    ({"gpus": 2, "extra": 1}, "extra", "unknown field"),
    ({"gpus": 2, "inplace": True}, "inplace", "in_place"),  # a misspelt option is not ignored
    ({"gpus": 2, "dry_run": "perhaps"}, "dry_run", "boolean"),
    ({"gpus": 2, "profile": None}, "profile", "null"),
    ({"gpus": 0}, "1 to 64", ""),
    ({"gpus": 65}, "1 to 64", ""),
    ({"gpus": -1}, "1 to 64", ""),
    ({"gpus": 10**30}, "1 to 64", ""),
    ({"gpus": 2, "profile": "nope"}, "nope", "no profile"),
]


@pytest.mark.parametrize("body, names, says", BAD_GPUS, ids=lambda v: json.dumps(v)[:40])
def test_bad_resize_input_is_a_400_with_a_clear_sentence_and_saves_nothing(body, names, says):
    llama_on_h100()
    before = saved_state()
    response = client_for(resizer()).post(gpus_url(), body, format="json")
    assert response.status_code == 400, response.content
    answer = response.json()
    assert set(answer) == {"detail", "code"}
    assert answer["code"] in ("invalid", "gpus_range", "no_profile"), answer
    assert names in answer["detail"] and says in answer["detail"], answer
    assert saved_state() == before


BAD_BODIES = [
    ("[2]", "application/json", "expected a dictionary"),
    ('"4"', "application/json", "expected a dictionary"),
    ("gpus=2", "application/json", "json parse error"),
    ('{"gpus": 2', "application/json", "json parse error"),
    ("", "application/json", "required"),
]


@pytest.mark.parametrize("raw, content_type, says", BAD_BODIES)
def test_a_body_that_is_not_a_json_object_is_a_400_and_saves_nothing(raw, content_type, says):
    llama_on_h100()
    before = saved_state()
    response = client_for(resizer()).generic("POST", gpus_url(), raw, content_type=content_type)
    assert response.status_code == 400, response.content
    assert says in response.json()["detail"].lower()
    assert response.json()["code"] in ("invalid", "parse_error")
    assert saved_state() == before


def test_a_form_encoded_number_is_a_string_and_is_refused():
    llama_on_h100()
    response = client_for(resizer()).post(gpus_url(), {"gpus": "2"})  # multipart: every value a string
    assert response.status_code == 400
    assert "whole number" in response.json()["detail"]


@pytest.mark.parametrize(
    "body, says",
    [
        ({"tokens": "8192"}, "whole number"),
        ({"tokens": 8192.0}, "whole number"),
        ({"tokens": False}, "true/false"),
        ({"tokens": -5}, "1 to 131072"),
        ({}, "required"),
        ({"tokens": 8192, "gpus": 2}, "unknown field"),
    ],
)
def test_bad_context_input_is_a_400_and_saves_nothing(body, says):
    llama_on_h100()
    before = saved_state()
    response = client_for(resizer()).post(context_url(), body, format="json")
    assert response.status_code == 400, response.content
    assert says in response.json()["detail"]
    assert saved_state() == before


def test_the_schema_documents_both_operations():
    response = client_for(user()).get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    assert "/api/models/{name}/gpus/" in paths and "/api/models/{name}/context/" in paths
