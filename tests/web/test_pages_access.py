"""The operator pages' access: sign-in and sign-out, the layout and its navigation, who sees what, and
the change endpoints refusing a viewer on the server."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import AuditEntry
from catalog.models import Profile, ServedModel
from operations.models import RestartOperation
from tests.support import builders as b
from tests.web.pages_support import HX, llama_on_h100, signed_in

pytestmark = pytest.mark.django_db


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
