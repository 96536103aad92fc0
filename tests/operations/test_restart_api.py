"""The restart API: start (202), list and read operations with their steps, cancel; access and audit."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from audit.models import AuditEntry
from operations.models import RestartOperation
from tests.support import builders as b

pytestmark = pytest.mark.django_db

MODEL = "llama"
RESTART = f"/api/models/{MODEL}/restart/"


@pytest.fixture
def llama():
    node = b.node("gpu-1", cards=4)
    profile = b.profile(b.llama_8b(MODEL), "h100")
    b.replica(profile, node, [0], name="llama-1")
    b.replica(profile, node, [1], name="llama-2")
    return profile


def client_for(user=None) -> APIClient:
    c = APIClient()
    if user is not None:
        c.force_authenticate(user)
    return c


def operator():
    return b.user("operator", "catalog.restart_model")


def test_anonymous_and_users_without_the_permission_cannot_restart(llama):
    assert APIClient().post(RESTART, {}, format="json").status_code in (401, 403)
    response = client_for(b.user("viewer")).post(RESTART, {"replicas": ["llama-1"]}, format="json")
    assert response.status_code == 403
    assert response.json() == {
        "detail": "You need the permission 'Can restart a model's replicas' (catalog.restart_model): "
        "the operator role gives it.",
        "code": "permission_denied",
    }
    assert not RestartOperation.objects.exists()


def test_an_operator_starts_a_restart_and_gets_the_operation_with_its_steps(llama):
    response = client_for(operator()).post(
        RESTART, {"replicas": ["llama-2", "llama-1"], "max_parallel": 2, "ready_timeout": 120}, format="json"
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert {
        k: body[k]
        for k in (
            "model",
            "profile",
            "state",
            "in_place",
            "max_parallel",
            "ready_timeout",
            "requested_by",
            "via",
            "mode",
        )
    } == {
        "model": MODEL,
        "profile": "h100",
        "state": "queued",
        "in_place": None,
        "max_parallel": 2,
        "ready_timeout": 120.0,
        "requested_by": "operator",
        "via": "api",
        "mode": "rolling where there is room, else in place",
    }
    assert [(s["old_replica"], s["state"], s["new_replica"]) for s in body["steps"]] == [
        ("llama-2", "pending", None),
        ("llama-1", "pending", None),
    ]
    op = RestartOperation.objects.get()
    assert op.requested_by.username == "operator"
    entry = AuditEntry.objects.get(action="restart_start")
    assert (entry.user.username, entry.via, entry.actor) == ("operator", "api", "operator")


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        ({}, 409, "nothing_to_restart"),
        ({"replicas": ["ghost"]}, 404, "not_found"),
        ({"replicas": ["llama-1"], "max_parallel": "2"}, 400, "invalid"),
        ({"replicas": ["llama-1"], "ready_timeout": True}, 400, "invalid"),
        ({"replicas": ["llama-1"], "in_plaice": True}, 400, "invalid"),
        ({"replicas": []}, 400, "empty"),
    ],
)
def test_refusals_have_the_one_error_shape(llama, payload, status, code):
    response = client_for(operator()).post(RESTART, payload, format="json")
    assert response.status_code == status, response.content
    assert response.json()["code"] == code and response.json()["detail"]


def test_a_second_restart_of_the_model_is_busy(llama):
    c = client_for(operator())
    assert c.post(RESTART, {"replicas": ["llama-1"]}, format="json").status_code == 202
    response = c.post(RESTART, {"replicas": ["llama-2"]}, format="json")
    assert (response.status_code, response.json()["code"]) == (409, "busy")


def test_signed_in_users_list_and_read_operations(llama):
    client_for(operator()).post(RESTART, {"replicas": ["llama-1"]}, format="json")
    op = RestartOperation.objects.get()
    viewer = client_for(b.user("viewer"))
    listing = viewer.get("/api/operations/", {"model": MODEL, "state": "queued"})
    assert listing.status_code == 200 and [o["id"] for o in listing.json()["results"]] == [op.pk]
    assert viewer.get("/api/operations/", {"state": "failed"}).json()["results"] == []
    detail = viewer.get(f"/api/operations/{op.pk}/").json()
    assert detail["steps"][0]["old_replica"] == "llama-1"
    assert APIClient().get("/api/operations/").status_code in (401, 403)
    assert viewer.get("/api/operations/999/").status_code == 404


def test_cancel_needs_the_permission_ends_a_queued_restart_and_is_audited(llama):
    client_for(operator()).post(RESTART, {"replicas": ["llama-1"]}, format="json")
    op = RestartOperation.objects.get()
    assert client_for(b.user("viewer")).post(f"/api/operations/{op.pk}/cancel/").status_code == 403
    c = client_for(b.user("lead", "catalog.restart_model"))
    response = c.post(f"/api/operations/{op.pk}/cancel/")
    assert response.status_code == 200, response.content
    assert (response.json()["state"], response.json()["cancel_requested"]) == ("cancelled", True)
    entry = AuditEntry.objects.get(action="restart_cancel")
    assert (entry.actor, entry.via) == ("lead", "api") and "asked by operator" in entry.message
    again = c.post(f"/api/operations/{op.pk}/cancel/")
    assert (again.status_code, again.json()["code"]) == (409, "finished")
    assert c.post("/api/operations/999/cancel/").status_code == 404


def test_the_restart_endpoints_are_in_the_openapi_schema():
    schema = client_for(b.user()).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert {
        "/api/models/{name}/restart/",
        "/api/operations/",
        "/api/operations/{id}/",
        "/api/operations/{id}/cancel/",
    } <= set(schema["paths"])
    assert "202" in schema["paths"]["/api/models/{name}/restart/"]["post"]["responses"]
