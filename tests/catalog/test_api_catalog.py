"""The catalog API: sign-in for reads, model permissions for writes, one error shape, audited."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from audit.models import AuditEntry
from catalog.models import GPUClass, ServedModel
from tests.support import builders as b

pytestmark = pytest.mark.django_db

LISTS = ["/api/gpu-classes/", "/api/nodes/", "/api/models/", "/api/profiles/", "/api/replicas/"]


def client_for(user=None) -> APIClient:
    c = APIClient()
    if user is not None:
        c.force_authenticate(user)
    return c


@pytest.mark.parametrize("url", LISTS)
def test_anonymous_requests_are_refused_with_the_error_shape(url):
    response = APIClient().get(url)
    assert response.status_code in (401, 403)
    assert response.json()["code"] == "not_authenticated"
    assert "credentials" in response.json()["detail"].lower()


@pytest.mark.parametrize("url", LISTS)
def test_signed_in_users_may_read_without_any_permission(url):
    response = client_for(b.user()).get(url)
    assert response.status_code == 200, response.content


def test_a_node_lists_its_cards_and_who_holds_them_but_never_its_token():
    n = b.node("gpu-1", cards=2, agent_token="s3cret")
    b.replica(b.profile(b.llama_8b()), n, [1], name="llama-1")
    body = client_for(b.user()).get("/api/nodes/gpu-1/").json()
    assert body["cards"] == [
        {"index": 0, "gpu_class": "h100-80g", "replica": None},
        {"index": 1, "gpu_class": "h100-80g", "replica": "llama-1"},
    ]
    assert "agent_token" not in body and "s3cret" not in str(body)


def test_a_model_is_looked_up_by_name_with_its_shape_and_profiles():
    b.profile(b.llama_8b("llama-3.1-8b"), "h100", args=["--max-model-len", "8192"])
    body = client_for(b.user()).get("/api/models/llama-3.1-8b/").json()
    assert body["kv_heads"] == 8 and body["kv_bytes_per_token"] == 131072
    assert [(p["name"], p["engine"], p["args"], p["cards"]) for p in body["profiles"]] == [
        ("h100", "vllm", ["--max-model-len", "8192"], 1)
    ]


def test_replicas_show_their_shards_by_node_and_whether_they_are_stale():
    n = b.node("gpu-1", cards=4)
    p = b.profile(b.llama_8b(), gpus=2)
    b.replica(p, n, [2, 3], name="r1")
    p.revision = 2
    p.save()
    (body,) = client_for(b.user()).get("/api/replicas/").json()["results"]
    assert body["shards"] == [{"node": "gpu-1", "cards": [2, 3]}]
    assert body["stale"] is True and body["model"] == "llama-3.1-8b"


def test_writing_needs_the_model_permission_and_writes_nothing_without_it():
    response = client_for(b.user()).post(
        "/api/gpu-classes/",
        {"name": "l4-24g", "memory_mib": 23034, "usable_mib": 20000, "compute_capability": "8.9"},
        format="json",
    )
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    assert not GPUClass.objects.filter(name="l4-24g").exists()
    assert AuditEntry.objects.count() == 0


def test_a_write_through_the_api_is_audited_once_with_user_via_and_request_id():
    user = b.user("alice", "catalog.add_gpuclass")
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {b.token(user)}", HTTP_X_REQUEST_ID="req-42")
    response = c.post(
        "/api/gpu-classes/",
        {"name": "l4-24g", "memory_mib": 23034, "usable_mib": 20000, "compute_capability": "8.9"},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response["X-Request-ID"] == "req-42"
    (entry,) = AuditEntry.objects.exclude(object_type="token")
    assert (entry.user, entry.actor, entry.via, entry.action, entry.request_id) == (
        user,
        "alice",
        "api",
        "create",
        "req-42",
    )
    assert entry.before is None and entry.after["name"] == "l4-24g"


def test_an_update_through_the_api_records_before_and_after():
    user = b.user("alice", "catalog.change_gpuclass")
    b.gpu_class("l4-24g", memory_mib=23034, usable_mib=20000, capability="8.9")
    response = client_for(user).patch("/api/gpu-classes/l4-24g/", {"usable_mib": 21000}, format="json")
    assert response.status_code == 200, response.content
    (entry,) = AuditEntry.objects.all()
    assert (entry.before["usable_mib"], entry.after["usable_mib"], entry.via) == (20000, 21000, "api")


def test_bad_input_gets_one_clear_sentence_and_changes_nothing():
    user = b.user("alice", "catalog.add_gpuclass")
    response = client_for(user).post(
        "/api/gpu-classes/",
        {"name": "l4", "memory_mib": "lots", "usable_mib": 20000, "compute_capability": "nine"},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert "memory_mib: A valid integer is required." in body["detail"]
    assert "compute_capability" in body["detail"]
    assert not GPUClass.objects.exists() and not AuditEntry.objects.exists()


def test_every_response_carries_a_request_id():
    response = client_for(b.user()).get("/api/models/")
    assert len(response["X-Request-ID"]) == 32


def test_declared_models_cannot_be_changed_or_removed_through_the_api():
    user = b.user(
        "alice",
        "catalog.change_servedmodel",
        "catalog.delete_servedmodel",
        "catalog.change_profile",
        "catalog.delete_profile",
        "catalog.add_profile",
    )
    m = b.llama_8b(declared=True, declared_in="/etc/llmgw/cluster.toml")
    p = b.profile(m)
    c = client_for(user)
    attempts = [
        c.patch(f"/api/models/{m.name}/", {"context_length": 8192}, format="json"),
        c.delete(f"/api/models/{m.name}/"),
        c.patch(f"/api/profiles/{p.pk}/", {"args": ["--max-model-len", "4096"]}, format="json"),
        c.delete(f"/api/profiles/{p.pk}/"),
        c.post("/api/profiles/", {"model": m.name, "name": "extra", "engine": "vllm"}, format="json"),
    ]
    for response in attempts:
        assert response.status_code == 409, response.content
        assert response.json()["code"] == "declared"
        assert "/etc/llmgw/cluster.toml" in response.json()["detail"]
        assert "sync_cluster_settings" in response.json()["detail"]
    m.refresh_from_db()
    assert m.context_length == 131072 and m.profiles.count() == 1
    assert AuditEntry.objects.count() == 0


def test_declared_cannot_be_set_through_the_api():
    user = b.user("alice", "catalog.add_servedmodel")
    response = client_for(user).post(
        "/api/models/", {"name": "m", "source": "org/m", "declared": True}, format="json"
    )
    assert response.status_code == 201
    assert ServedModel.objects.get(name="m").declared is False


def test_the_openapi_schema_and_its_ui_are_served():
    c = client_for(b.user())
    schema = c.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/models/{name}/" in schema.json()["paths"]
    docs = c.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
    assert b"cdn" not in docs.content.lower()


def test_removing_a_model_removes_its_stopped_replicas_each_audited():
    user = b.user("alice", "catalog.delete_servedmodel")
    n = b.node("gpu-1", cards=2)
    p = b.profile(b.llama_8b())
    r = b.replica(p, n, [0], name="old-1", state="stopped")
    r.shards.all().delete()  # a stopped replica holds no cards
    response = client_for(user).delete("/api/models/llama-3.1-8b/")
    assert response.status_code == 204, response.content
    assert not ServedModel.objects.exists()
    assert list(AuditEntry.objects.order_by("id").values_list("action", "object_type", "object_key")) == [
        ("delete", "replica", "old-1"),
        ("delete", "model", "llama-3.1-8b"),
    ]


def test_a_model_with_a_live_replica_is_not_removed():
    user = b.user("alice", "catalog.delete_servedmodel")
    b.replica(b.profile(b.llama_8b()), b.node("gpu-1", cards=1), [0], name="live-1")
    response = client_for(user).delete("/api/models/llama-3.1-8b/")
    assert response.status_code == 409 and response.json()["code"] == "in_use"
    assert ServedModel.objects.exists() and not AuditEntry.objects.exists()


def test_an_unknown_filter_is_refused_with_a_400_naming_the_known_ones():
    n = b.node("gpu-1", cards=2)
    b.replica(b.profile(b.llama_8b()), n, [0], name="llama-1")
    api = client_for(b.user())
    response = api.get("/api/replicas/?model_name=mistral-7b")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "unknown_filter"
    assert "Unknown query parameter model_name:" in body["detail"]
    assert "filtered by format, limit, model, offset, profile, state." in body["detail"]
    assert "profile__model__name" not in body["detail"]  # an ORM path: still read, not offered
    # The known ones still filter, and the pager's parameters are known too.
    assert api.get("/api/replicas/?profile__model__name=mistral-7b&limit=5").json()["count"] == 0
    assert api.get("/api/replicas/?profile__model__name=llama-3.1-8b").json()["count"] == 1
    assert api.get("/api/replicas/?model=llama-3.1-8b").json()["count"] == 1
    assert api.get("/api/replicas/?model=mistral-7b").json()["count"] == 0
    assert api.get("/api/operations/?modell=x").status_code == 400


def test_the_api_docs_describe_each_list_for_its_readers():
    schema = client_for(b.user()).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    text = schema.content.decode()
    assert "save_service" not in text and "ModelViewSet" not in text
    assert "Running instances of a profile" in text
