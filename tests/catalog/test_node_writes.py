"""A node's writes: its agent token is printable ASCII of 32 characters or more, and its state is
changed by cordon, uncordon and drain only, never by an edit (the API's PATCH, PUT or POST, the
admin). Every refusal says what is wrong and where to go, saves nothing and writes no audit entry."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from catalog.models import Node
from tests.support import builders as b

pytestmark = pytest.mark.django_db

GOOD = "a-good-agent-token-0123456789abcdef"  # 35 characters


def _api(*perms: str) -> APIClient:
    client = APIClient()
    client.force_authenticate(b.user(f"editor-{len(perms)}", *perms, roles=("editor", "operator")))
    return client


def _nothing_written(before: tuple[int, int, list[Any]]) -> bool:
    return (Node.objects.count(), AuditEntry.objects.count(), list(Node.objects.values())) == before


def _state() -> tuple[int, int, list[Any]]:
    return Node.objects.count(), AuditEntry.objects.count(), list(Node.objects.values())


# -- the agent token -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    [
        "t" * 31,  # too short
        "x",
        "é" * 40,  # not ASCII
        "token with spaces in it 0123456789",
        "token-with-a-newline\n0123456789abcdef",
        "token-with-a-tab\t0123456789abcdefgh",
        "t" * 201,
    ],
)
def test_an_agent_token_that_is_not_printable_ascii_of_32_characters_is_refused(token):
    before = _state()
    response = _api().post(
        "/api/nodes/",
        {"name": "gpu-1", "agent_url": "http://10.0.0.5:9101", "agent_token": token},
        format="json",
    )
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert "32 to 200 printable ASCII characters without spaces" in detail and "token_urlsafe" in detail
    assert token not in detail
    assert _nothing_written(before)


def test_a_token_of_32_printable_characters_is_taken_and_a_node_with_a_short_one_must_be_given_a_new_one():
    client = _api()
    made = client.post(
        "/api/nodes/",
        {"name": "gpu-1", "agent_url": "http://10.0.0.5:9101", "agent_token": "!" * 32},
        format="json",
    )
    assert made.status_code == 201, made.content
    legacy = b.node(
        "gpu-2", agent_url="http://10.0.0.6:9101", agent_token="short"
    )  # written before the check
    before = _state()
    kept = client.patch(
        f"/api/nodes/{legacy.name}/", {"agent_url": "http://10.0.0.7:9101", "agent_token": "x"}
    )
    assert kept.status_code == 400 and "printable ASCII" in kept.json()["detail"]
    assert _nothing_written(before)
    fixed = client.patch(
        f"/api/nodes/{legacy.name}/",
        {"agent_url": "http://10.0.0.7:9101", "agent_token": GOOD},
        format="json",
    )
    assert fixed.status_code == 200, fixed.content


def test_the_admin_refuses_a_short_token_on_the_form(admin_client):
    before = _state()
    response = admin_client.post(
        "/admin/catalog/node/add/",
        {
            "name": "gpu-1",
            "agent_url": "http://10.0.0.5:9101",
            "agent_token": "short-token",
            "cards-TOTAL_FORMS": "0",
            "cards-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 200
    assert "32 to 200 printable ASCII characters" in response.content.decode()
    assert _nothing_written(before)


def test_a_node_recorded_with_a_token_that_cannot_be_sent_gets_a_sentence_not_a_500():
    node = b.node("gpu-1", agent_token="tökén-" + "x" * 40)
    b.replica(b.profile(b.llama_8b("llama")), node, [0], name="llama-1")
    client = Client()
    client.force_login(b.user("viewer"))
    response = client.get("/replicas/llama-1/log/")
    assert response.status_code == 200
    assert "not printable ASCII" in response.content.decode() and "tökén" not in response.content.decode()


# -- the state -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["patch", "put"])
def test_an_edit_naming_another_state_is_refused_pointing_at_cordon_uncordon_and_drain(method):
    node = b.node("gpu-1", agent_url="http://10.0.0.5:9101")
    before = _state()
    body = {"name": "gpu-1", "agent_url": node.agent_url, "agent_token": GOOD, "state": "cordoned"}
    response = getattr(_api(), method)("/api/nodes/gpu-1/", body, format="json")
    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["code"] == "state_by_operation"
    assert all(word in answer["detail"] for word in ("/api/nodes/gpu-1/cordon/", "/uncordon/", "/drain/"))
    assert _nothing_written(before)


def test_a_new_node_is_ready_and_naming_the_state_it_has_changes_nothing():
    client = _api()
    refused = client.post(
        "/api/nodes/",
        {"name": "gpu-1", "agent_url": "http://10.0.0.5:9101", "agent_token": GOOD, "state": "down"},
        format="json",
    )
    assert refused.status_code == 400 and refused.json()["code"] == "state_by_operation"
    made = client.post(
        "/api/nodes/",
        {"name": "gpu-1", "agent_url": "http://10.0.0.5:9101", "agent_token": GOOD, "state": "ready"},
        format="json",
    )
    assert made.status_code == 201 and made.json()["state"] == "ready"
    same = client.patch("/api/nodes/gpu-1/", {"state": "ready"}, format="json")
    assert same.status_code == 200


def test_the_admin_shows_the_state_read_only_and_a_posted_state_changes_nothing(admin_client):
    node = b.node("gpu-1", agent_url="http://10.0.0.5:9101")
    page = admin_client.get(f"/admin/catalog/node/{node.pk}/change/").content.decode()
    assert 'name="state"' not in page
    response = admin_client.post(
        f"/admin/catalog/node/{node.pk}/change/",
        {
            "name": "gpu-1",
            "agent_url": node.agent_url,
            "agent_token": "",
            "state": "down",
            "cards-TOTAL_FORMS": "0",
            "cards-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302
    assert Node.objects.get(pk=node.pk).state == "ready"


def test_the_service_refuses_a_state_change_on_every_path(actor):
    from base.errors import DomainError
    from catalog.services.catalog import node_save

    node = b.node("gpu-1", agent_url="http://10.0.0.5:9101")
    node.state = "cordoned"
    with pytest.raises(DomainError) as caught:
        node_save(instance=node)
    assert caught.value.code == "state_by_operation"
    assert Node.objects.get(pk=node.pk).state == "ready" and not AuditEntry.objects.exists()


def test_a_node_marked_down_is_uncordoned_back_to_ready():
    b.node("gpu-1", state="down")
    response = _api("catalog.restart_model").post("/api/nodes/gpu-1/uncordon/")
    assert response.status_code == 200 and response.json() == {"node": "gpu-1", "state": "ready"}
    entry = AuditEntry.objects.get(action="uncordon")
    assert (entry.before, entry.after) == ({"state": "down"}, {"state": "ready"})
