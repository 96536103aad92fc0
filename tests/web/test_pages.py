"""The operator pages: sign-in, who sees what, the htmx fragments, the resize and
context previews (the API's sentences), apply (audited once, through the
pages), the restart operation pages, and query counts that do not grow with
the fleet."""

from __future__ import annotations

import html

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from audit.models import AuditEntry
from catalog.models import Profile, ServedModel
from operations.models import RestartOperation, RestartStep
from tests.support import builders as b

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


# -- a fleet ----------------------------------------------------------------------------------------------


def fleet(size: int) -> None:
    """``size`` nodes of 8 cards and ``size`` models, each with a profile and a replica on two cards,
    one of them stale."""
    for i in range(size):
        n = b.node(f"gpu-{i:02d}")
        p = b.profile(b.llama_8b(f"model-{i:02d}"), "h100", gpus=2)
        b.replica(p, n, [0, 1], name=f"model-{i:02d}-1", port=8000 + i)
        b.replica(p, n, [2, 3], name=f"model-{i:02d}-2", port=9000 + i)
        Profile.objects.filter(pk=p.pk).update(revision=2)  # the second replica is now stale...
        p.replicas.filter(name=f"model-{i:02d}-1").update(revision=2)  # ...the first is not


def llama_on_h100() -> ServedModel:
    """llama-3.1-8b on one h100 card at 32k tokens, a replica on gpu-1; gpu-1 and gpu-2 have room."""
    n = b.node("gpu-1")
    b.node("gpu-2")
    m = b.llama_8b("llama-3.1-8b")
    p = b.profile(m, "h100", args=["--max-model-len", "32768"])
    b.replica(p, n, [0], name="llama-1")
    return m


def big_on_h100() -> ServedModel:
    """A 140 GB model on two h100 cards: it does not fit on one."""
    n = b.node("gpu-9")
    m = b.llama_8b(
        "big-70b",
        weight_bytes=140_000_000_000,
        attention_heads=64,
        layers=80,
        kv_bytes_per_token=2 * 80 * 8 * 128 * 2,
    )
    p = b.profile(m, "h100", gpus=2, args=["--max-model-len", "8192"])
    b.replica(p, n, [0, 1], name="big-1")
    return m


def signed_in(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


@pytest.fixture
def viewer() -> Client:
    return signed_in(b.user("viewer"))


@pytest.fixture
def operator_user():
    return b.user("operator", "catalog.resize_model", "catalog.restart_model")


@pytest.fixture
def operator(operator_user) -> Client:
    return signed_in(operator_user)


def api_detail(model: str, body: dict) -> str:
    """The API's sentence for the same dry run, as a superuser would get it."""
    api = APIClient()
    api.force_authenticate(b.user("api-admin", "catalog.resize_model"))
    kind = "gpus" if "gpus" in body else "context"
    response = api.post(f"/api/models/{model}/{kind}/", {**body, "dry_run": True}, format="json")
    assert response.status_code >= 400, response.content
    return response.json()["detail"]


# -- access -----------------------------------------------------------------------------------------------

PAGES = ["/", "/models/llama-3.1-8b/", "/nodes/", "/nodes/gpu-1/", "/operations/"]
POSTS = [
    "/models/llama-3.1-8b/resize/preview/",
    "/models/llama-3.1-8b/resize/",
    "/models/llama-3.1-8b/context/preview/",
    "/models/llama-3.1-8b/context/",
    "/models/llama-3.1-8b/restart/",
]


@pytest.mark.parametrize("url", PAGES + POSTS)
def test_anonymous_visitors_are_sent_to_sign_in(url):
    llama_on_h100()
    response = Client().post(url, {"gpus": 2}) if url in POSTS else Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")
    assert Profile.objects.get().revision == 1


def test_signing_in_lands_on_the_models_list():
    b.user("someone", password="pw-for-tests-only-123")
    c = Client()
    page = c.get("/accounts/login/")
    assert page.status_code == 200 and b'<label for="id_username">' in page.content
    response = c.post("/accounts/login/", {"username": "someone", "password": "pw-for-tests-only-123"})
    assert response.status_code == 302 and response["Location"] == "/"
    home = c.get("/")
    assert b"<h1>Models</h1>" in home.content and b"Signed in as <strong>someone</strong>" in home.content


def test_signing_out_is_a_post_form():
    c = signed_in(b.user())
    page = c.get("/").content.decode()
    assert '<form method="post" action="/accounts/logout/">' in page
    assert c.post("/accounts/logout/").status_code == 302
    assert c.get("/").status_code == 302


def test_the_layout_carries_htmx_the_csrf_header_and_the_navigation(viewer):
    page = viewer.get("/").content.decode()
    assert '<script src="/static/vendor/htmx.min.js" defer></script>' in page
    assert 'hx-headers=\'{"X-CSRFToken": "' in page
    for href in ('href="/nodes/"', 'href="/operations/"', 'href="/api/docs/"'):
        assert href in page
    # The audit log is the leads' (audit.view_auditentry): no link that would only answer "not allowed".
    assert 'href="/audit/"' not in page
    assert "cdn" not in page.lower()


NAV = {
    "Models": 'href="/"',
    "Nodes": 'href="/nodes/"',
    "Operations": 'href="/operations/"',
    "Audit": 'href="/audit/"',
    "Admin": 'href="/admin/"',
    "API docs": 'href="/api/docs/"',
}


@pytest.mark.parametrize(
    "roles, shown",
    [
        ((), {"API docs"}),
        (("viewer",), {"Models", "Nodes", "Operations", "API docs"}),
        (("operator",), {"Models", "Nodes", "Operations", "API docs"}),
        (("editor",), {"Models", "Nodes", "Operations", "Admin", "API docs"}),
        (("lead",), {"Models", "Nodes", "Operations", "Audit", "Admin", "API docs"}),
        (("admin",), set(NAV)),
    ],
)
def test_the_navigation_shows_only_what_the_user_may_open(roles, shown):
    # The models list, or for a user with no role its 403 page: the same layout.
    page = signed_in(b.user("someone", roles=roles)).get("/").content.decode()
    nav = page[page.index('<nav aria-label="Main">') : page.index("</nav>")]
    assert {label for label, href in NAV.items() if f"{href}" in nav and f">{label}</a>" in nav} == shown


@pytest.mark.parametrize("url", PAGES)
def test_a_viewer_sees_every_page_read_only(viewer, url):
    llama_on_h100()
    page = viewer.get(url)
    assert page.status_code == 200
    text = page.content.decode()
    assert "hx-post" not in text and "Apply" not in text and 'name="gpus"' not in text
    assert "Cancel restart" not in text and "/restart/" not in text


def test_a_viewer_is_told_why_there_is_no_form(viewer):
    llama_on_h100()
    assert (
        b"Read-only: resizing or changing the context needs the resize permission."
        in viewer.get("/models/llama-3.1-8b/").content
    )


@pytest.mark.parametrize("url", POSTS)
def test_the_change_endpoints_refuse_a_viewer_on_the_server(viewer, url):
    llama_on_h100()
    response = viewer.post(url, {"gpus": 2, "tokens": 8192, "profile": "h100"}, **HX)
    assert response.status_code == 403
    assert Profile.objects.get().revision == 1
    assert not AuditEntry.objects.filter(via="ui").exists()
    assert not RestartOperation.objects.exists()


def test_an_operator_gets_the_resize_and_context_forms_with_labels(operator):
    llama_on_h100()
    page = operator.get("/models/llama-3.1-8b/").content.decode()
    assert '<label for="resize_gpus">Cards per replica</label>' in page
    assert '<label for="context_tokens">Context (tokens)</label>' in page
    assert '<label for="resize_in_place">In place</label>' in page
    assert 'hx-post="/models/llama-3.1-8b/resize/preview/"' in page
    assert 'hx-trigger="input changed delay:300ms, change, submit"' in page
    assert 'hx-target="#resize-preview"' in page
    # One profile on cards: nothing to choose, it rides along hidden.
    assert '<input type="hidden" name="profile" value="h100"' in page


def test_a_model_with_several_profiles_on_cards_offers_a_choice(operator):
    m = llama_on_h100()
    b.profile(m, "h100-long", args=["--max-model-len", "131072"])
    page = operator.get("/models/llama-3.1-8b/").content.decode()
    assert '<select name="profile" id="resize_profile">' in page
    assert '<label for="resize_profile">Profile</label>' in page


def test_a_declared_model_shows_where_to_change_it_instead_of_a_form(operator):
    m = llama_on_h100()
    ServedModel.objects.filter(pk=m.pk).update(declared=True, declared_in="/etc/llmgw/cluster.toml")
    page = operator.get("/models/llama-3.1-8b/").content.decode()
    assert "read-only here" in page and "<code>/etc/llmgw/cluster.toml</code>" in page
    assert "sync_cluster_settings" in page
    assert 'name="gpus"' not in page


# -- pages and fragments ----------------------------------------------------------------------------------


def test_the_model_page_shows_shape_profiles_replicas_and_the_card_memory_bar(viewer):
    m = llama_on_h100()
    replica = m.profiles.get().replicas.get()
    Profile.objects.filter(model=m).update(revision=3)
    page = viewer.get("/models/llama-3.1-8b/").content.decode()
    assert "<dt>Weights</dt><dd>15.0 GiB</dd>" in page
    assert "<dt>KV cache a token</dt><dd>128 KiB</dd>" in page
    assert "<dt>Attention</dt><dd>GQA</dd>" in page
    assert "<dd>32 attention, 8 KV</dd>" in page and "<dt>Head size</dt><dd>128</dd>" in page
    assert "<dt>Context</dt><dd>131072 tokens</dd>" in page
    # The bar: weights, KV cache for the profile's context, overhead, against the usable 71.7 GiB.
    assert (
        'class="seg seg-weights' in page and 'class="seg seg-kv' in page and 'class="seg seg-overhead' in page
    )
    assert "weights 15.0 GiB" in page and "KV cache 4.0 GiB (32768 tokens)" in page
    # 14.96 + 4.0 + vLLM's terms at TP 1 (outside PyTorch 0.35, CUDA graphs 1), each its own segment
    assert "20.3 GiB a card of 71.7 GiB usable (28%)" in page
    assert "outside PyTorch 0.3 GiB" in page and "CUDA graphs 1.0 GiB" in page
    assert "Budget: 79.65 GiB x --gpu-memory-utilization 0.9, capped by the class" in page
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


# -- the resize and context previews ----------------------------------------------------------------------


def test_a_count_that_fits_previews_before_after_the_bar_and_the_nodes_with_room(operator):
    llama_on_h100()
    response = operator.post("/models/llama-3.1-8b/resize/preview/", {"gpus": "4", "profile": "h100"}, **HX)
    assert response.status_code == 200
    text = response.content.decode()
    assert "<html" not in text
    assert "1 → <strong>4</strong> cards" in text
    # 3.74 + 1.0 + outside PyTorch 0.35 + NVLink buffers 1.8 + CUDA graphs 1
    assert "weights 3.7 GiB" in text and "7.9 GiB a card of 71.7 GiB usable" in text
    assert "communication buffers 1.8 GiB" in text
    # the whole argument list the engine gets, the TP width included (the program itself is the
    # node agent's own, from its configuration: the launch policy never takes it from the catalog)
    assert '<code class="launch">meta-llama/Llama-3.1-8B-Instruct --port {port}' in text
    assert "--tensor-parallel-size 4 --max-model-len 32768" in text
    assert "<code>--max-model-len 32768</code>" in text
    assert "Room beside the running replicas on <strong>gpu-1, gpu-2</strong>" in text
    assert 'hx-post="/models/llama-3.1-8b/resize/"' in text and "Apply: 4 cards" in text
    assert Profile.objects.get().revision == 1  # a dry run


@pytest.mark.parametrize(
    ("model", "body", "code"),
    [
        ("big-70b", {"gpus": 1}, "memory"),
        ("big-70b", {"gpus": 3}, "heads"),
        ("big-70b", {"gpus": 65}, "gpus_range"),
        ("big-70b", {"gpus": 2}, "unchanged"),
        ("big-70b", {"gpus": 16}, "too_few_cards"),
        ("big-70b", {"tokens": 10_000_000}, "context_range"),
    ],
)
def test_a_refused_preview_answers_200_with_the_apis_sentence(operator, model, body, code):
    big_on_h100()
    sentence = api_detail(model, body)
    kind = "resize" if "gpus" in body else "context"
    response = operator.post(f"/models/{model}/{kind}/preview/", {**body, "profile": "h100"}, **HX)
    assert response.status_code == 200
    text = response.content.decode()
    assert "<html" not in text
    assert html.escape(sentence) in text, (sentence, text)
    assert "Apply" not in text


def test_a_memory_refusal_shows_the_overflowing_bar_and_both_ways_out(operator):
    big_on_h100()
    text = operator.post(
        "/models/big-70b/resize/preview/", {"gpus": 1, "profile": "h100"}, **HX
    ).content.decode()
    assert '<figure class="membar over">' in text and 'class="limit"' in text
    assert "more than the 71.7 GiB usable on each" in text
    assert "Two ways out: more cards (2 cards would hold it), or a shorter context" in text


def test_the_context_preview_uses_the_same_rules(operator):
    llama_on_h100()
    text = operator.post(
        "/models/llama-3.1-8b/context/preview/", {"tokens": 131072, "profile": "h100"}, **HX
    ).content.decode()
    assert "32768 → <strong>131072</strong> tokens" in text
    assert "KV cache 16.0 GiB (131072 tokens)" in text
    assert "<code>--max-model-len 131072</code>" in text
    assert 'hx-post="/models/llama-3.1-8b/context/"' in text


def test_the_preview_says_once_what_it_could_not_check(operator):
    m = llama_on_h100()
    ServedModel.objects.filter(pk=m.pk).update(weight_bytes=None)
    text = operator.post(
        "/models/llama-3.1-8b/resize/preview/", {"gpus": 2, "profile": "h100"}, **HX
    ).content.decode()
    assert "Not checked" in text
    assert text.count("weight bytes are not known, so what each card holds is not checked.") == 1
    assert "membar" not in text and "Apply: 2 cards" in text


def test_what_is_not_a_whole_number_is_refused_in_the_preview(operator):
    llama_on_h100()
    response = operator.post(
        "/models/llama-3.1-8b/resize/preview/", {"gpus": "four", "profile": "h100"}, **HX
    )
    assert response.status_code == 200 and b"A card count is a whole number." in response.content


def test_the_preview_without_htmx_renders_the_whole_page_with_the_preview(operator):
    llama_on_h100()
    response = operator.post("/models/llama-3.1-8b/resize/preview/", {"gpus": 2, "profile": "h100"})
    text = response.content.decode()
    assert response.status_code == 200 and text.lstrip().startswith("<!doctype html>")
    assert "1 → <strong>2</strong> cards" in text and 'value="2"' in text


# -- apply ------------------------------------------------------------------------------------------------


def test_apply_saves_the_profile_audits_once_through_the_pages_and_goes_back_to_the_model(
    operator, operator_user
):
    llama_on_h100()
    response = operator.post("/models/llama-3.1-8b/resize/", {"gpus": 2, "profile": "h100"}, **HX)
    assert response.status_code == 204
    assert response["HX-Location"] == "/models/llama-3.1-8b/#restart"
    profile = Profile.objects.get()
    assert (profile.revision, profile.tp, profile.gpus_per_node) == (2, 2, 2)
    entries = AuditEntry.objects.filter(action="resize")
    assert entries.count() == 1
    entry = entries.get()
    assert (entry.via, entry.actor, entry.user_id) == ("ui", "operator", operator_user.pk)
    assert entry.before["tp"] == 1 and entry.after["tp"] == 2
    page = operator.get("/models/llama-3.1-8b/").content.decode()
    assert "llama-3.1-8b/h100: 1 → 2 cards, saved as revision 2." in page


def test_apply_without_htmx_redirects_with_303(operator):
    llama_on_h100()
    response = operator.post("/models/llama-3.1-8b/context/", {"tokens": 65536, "profile": "h100"})
    assert response.status_code == 303 and response["Location"] == "/models/llama-3.1-8b/#restart"
    assert Profile.objects.get().args == ["--max-model-len", "65536"]
    assert AuditEntry.objects.filter(action="set_context", via="ui").count() == 1


def test_apply_is_checked_again_on_the_server_and_saves_nothing_when_refused(operator):
    big_on_h100()
    response = operator.post("/models/big-70b/resize/", {"gpus": 1, "profile": "h100"}, **HX)
    assert response.status_code == 200 and b"Does not fit:" in response.content
    assert Profile.objects.get().revision == 1
    assert not AuditEntry.objects.filter(via="ui").exists()


def test_apply_refuses_a_declared_model_even_when_posted_by_hand(operator):
    m = llama_on_h100()
    ServedModel.objects.filter(pk=m.pk).update(declared=True)
    response = operator.post("/models/llama-3.1-8b/resize/", {"gpus": 2, "profile": "h100"}, **HX)
    assert response.status_code == 200 and b"read-only here" in response.content
    assert Profile.objects.get().revision == 1


# -- restart operations -----------------------------------------------------------------------------------


def operation(model: ServedModel, state: str = "running", **fields) -> RestartOperation:
    profile = model.profiles.get()
    op = RestartOperation.objects.create(
        model=model, profile=profile, state=state, requested_by_name="operator", via="ui", **fields
    )
    for replica in profile.replicas.all():
        RestartStep.objects.create(
            operation=op, old_replica=replica, node="gpu-1", cards=[3], state="waiting"
        )
    return op


def test_a_running_operation_polls_itself_and_a_finished_one_does_not(viewer):
    m = llama_on_h100()
    op = operation(m)
    fragment = viewer.get(f"/operations/{op.pk}/", **HX).content.decode()
    assert "<html" not in fragment
    assert f'hx-get="/operations/{op.pk}/" hx-trigger="every 1s"' in fragment
    assert "llama-1" in fragment and "waiting" in fragment
    RestartOperation.objects.filter(pk=op.pk).update(state="succeeded", reason="All 1 replicas restarted.")
    RestartStep.objects.filter(operation=op).update(state="succeeded")
    done = viewer.get(f"/operations/{op.pk}/", **HX).content.decode()
    assert "hx-trigger" not in done and "1 of 1 step done" in done and "All 1 replicas restarted." in done
    whole = viewer.get(f"/operations/{op.pk}/").content.decode()
    assert whole.lstrip().startswith("<!doctype html>") and "Restart #" in whole


def test_the_model_page_shows_its_latest_restart_live(viewer):
    m = llama_on_h100()
    op = operation(m)
    page = viewer.get("/models/llama-3.1-8b/").content.decode()
    assert f'id="operation-{op.pk}"' in page and 'hx-trigger="every 1s"' in page


def test_the_operations_list_shows_state_and_steps(viewer):
    m = llama_on_h100()
    op = operation(m, state="partly_failed")
    RestartStep.objects.filter(operation=op).update(state="failed", reason="not ready within 600 s")
    page = viewer.get("/operations/").content.decode()
    assert f'href="/operations/{op.pk}/"' in page and "partly failed" in page and "1 failed" in page


def test_an_operator_can_cancel_a_running_restart_and_it_is_audited(operator):
    m = llama_on_h100()
    op = operation(m)
    page = operator.get(f"/operations/{op.pk}/").content.decode()
    assert f'hx-post="/operations/{op.pk}/cancel/"' in page
    response = operator.post(f"/operations/{op.pk}/cancel/", **HX)
    assert response.status_code == 200 and b"<html" not in response.content
    assert b"Cancel asked" in response.content and b'hx-swap-oob="true"' in response.content
    assert RestartOperation.objects.get().cancel_requested
    assert AuditEntry.objects.filter(action="restart_cancel", via="ui").count() == 1


def test_a_viewer_cannot_cancel(viewer):
    m = llama_on_h100()
    op = operation(m)
    assert "Cancel restart" not in viewer.get(f"/operations/{op.pk}/").content.decode()
    assert viewer.post(f"/operations/{op.pk}/cancel/").status_code == 403
    assert not RestartOperation.objects.get().cancel_requested


def test_an_operator_restarts_stale_replicas_from_the_model_page(operator):
    m = llama_on_h100()
    Profile.objects.filter(model=m).update(revision=2)
    page = operator.get("/models/llama-3.1-8b/").content.decode()
    assert "Restart 1 stale replica on llama-3.1-8b's current profile" in page
    response = operator.post("/models/llama-3.1-8b/restart/", **HX)
    assert response.status_code == 204 and response["HX-Location"] == "/models/llama-3.1-8b/#restart"
    op = RestartOperation.objects.get()
    assert (op.via, op.requested_by_name, op.steps.count()) == ("ui", "operator", 1)


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
    assert "Memory a card: planned and measured" in page
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
