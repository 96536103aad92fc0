"""The admin writes through the services: audited once, declared models untouchable."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from audit.models import AuditEntry
from catalog.models import GPUClass, ServedModel
from tests.support import builders as b

pytestmark = pytest.mark.django_db

FIXTURES = __import__("pathlib").Path(__file__).parents[1] / "fixtures" / "hf-configs"


@pytest.fixture
def admin_client(db) -> Client:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser("root", "root@example.org", "pw-for-tests-only-123")
    c = Client()
    c.force_login(user)
    return c


def test_an_admin_edit_writes_one_entry_with_the_user_and_before_after(admin_client):
    cls = b.gpu_class("l4-24g", memory_mib=23034, usable_mib=20000, capability="8.9")
    response = admin_client.post(
        f"/admin/catalog/gpuclass/{cls.pk}/change/",
        {"name": "l4-24g", "memory_mib": 23034, "usable_mib": 21000, "compute_capability": "8.9"},
    )
    assert response.status_code == 302, response.content
    (entry,) = AuditEntry.objects.all()
    assert (entry.actor, entry.via, entry.action) == ("root", "admin", "update")
    assert (entry.before["usable_mib"], entry.after["usable_mib"]) == (20000, 21000)


def test_an_admin_delete_is_audited(admin_client):
    cls = b.gpu_class("l4-24g")
    response = admin_client.post(f"/admin/catalog/gpuclass/{cls.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not GPUClass.objects.exists()
    (entry,) = AuditEntry.objects.all()
    assert (entry.action, entry.via, entry.after, entry.before["name"]) == ("delete", "admin", None, "l4-24g")


def test_a_declared_model_is_read_only_in_the_admin_and_says_where_to_change_it(admin_client):
    m = b.llama_8b(declared=True, declared_in="/etc/llmgw/cluster.toml")
    page = admin_client.get(f"/admin/catalog/servedmodel/{m.pk}/change/")
    assert page.status_code == 200
    assert b"/etc/llmgw/cluster.toml" in page.content
    assert b'name="context_length"' not in page.content  # shown, not editable
    response = admin_client.post(
        f"/admin/catalog/servedmodel/{m.pk}/change/",
        {
            "name": m.name,
            "source": "elsewhere",
            "context_length": 8,
            "sliding_layers": 0,
            "profiles-TOTAL_FORMS": 0,
            "profiles-INITIAL_FORMS": 0,
        },
        follow=True,
    )
    assert b"read-only here" in response.content
    m.refresh_from_db()
    assert m.source == "meta-llama/Llama-3.1-8B-Instruct" and m.context_length == 131072
    assert admin_client.post(f"/admin/catalog/servedmodel/{m.pk}/delete/", {"post": "yes"}).status_code == 403
    assert ServedModel.objects.filter(pk=m.pk).exists()
    assert AuditEntry.objects.count() == 0


def test_the_admin_edits_the_whole_shape_and_a_figure_left_empty_stays_as_it_was(admin_client):
    m = b.llama_8b()
    ServedModel.objects.filter(pk=m.pk).update(replicated_bytes=1024, sliding_layers=0)
    page = admin_client.get(f"/admin/catalog/servedmodel/{m.pk}/change/").content.decode()
    assert 'name="hidden_size"' in page and 'name="expert_format"' in page
    response = admin_client.post(
        f"/admin/catalog/servedmodel/{m.pk}/change/",
        {
            "name": m.name,
            "source": m.source,
            "context_length": 131072,
            "hidden_size": 4096,
            "expert_format": "mxfp4",
            "replicated_bytes": "",
            "profiles-TOTAL_FORMS": 0,
            "profiles-INITIAL_FORMS": 0,
        },
    )
    assert response.status_code == 302, response.content
    m.refresh_from_db()
    assert (m.hidden_size, m.expert_format, m.replicated_bytes, m.sliding_layers) == (4096, "mxfp4", 1024, 0)


def test_the_node_list_shows_free_cards_per_class(admin_client):
    n = b.node("gpu-1", cards=4)
    b.replica(b.profile(b.llama_8b(), gpus=2), n, [0, 1])
    page = admin_client.get("/admin/catalog/node/")
    assert b"h100-80g: 2/4 free" in page.content


def test_the_model_list_counts_replicas_and_stale_ones(admin_client):
    n = b.node("gpu-1", cards=4)
    p = b.profile(b.llama_8b())
    b.replica(p, n, [0])
    b.replica(p, n, [1])
    p.revision = 2
    p.save()
    b.replica(p, n, [2])
    page = admin_client.get("/admin/catalog/servedmodel/").content.decode()
    assert '<td class="field-replica_count">3</td>' in page
    assert '<td class="field-stale_count">2</td>' in page


def test_importing_an_uploaded_config_creates_the_model_with_its_shape(admin_client):
    config = (FIXTURES / "meta-llama__Llama-3.1-8B-Instruct.json").read_bytes()
    index = json.dumps({"metadata": {"total_size": 16060522496}, "weight_map": {}}).encode()
    response = admin_client.post(
        "/admin/catalog/servedmodel/import-config/",
        {
            "name": "llama-3.1-8b",
            "source": "meta-llama/Llama-3.1-8B-Instruct",
            "config": SimpleUploadedFile("config.json", config),
            "index": SimpleUploadedFile("model.safetensors.index.json", index),
        },
    )
    assert response.status_code == 302, response.content
    m = ServedModel.objects.get(name="llama-3.1-8b")
    assert (m.kv_heads, m.kv_bytes_per_token, m.weight_bytes) == (8, 2 * 32 * 8 * 128 * 2, 16060522496)
    (entry,) = AuditEntry.objects.all()
    assert (entry.via, entry.action, entry.object_key) == ("admin", "create", "llama-3.1-8b")


def test_an_unreadable_config_is_refused_naming_the_file_and_nothing_is_saved(admin_client):
    response = admin_client.post(
        "/admin/catalog/servedmodel/import-config/",
        {
            "name": "broken",
            "source": "x",
            "config": SimpleUploadedFile("config.json", b'{"num_hidden_layers": "many"'),
        },
    )
    assert response.status_code == 200
    assert b"config.json" in response.content
    assert not ServedModel.objects.exists() and not AuditEntry.objects.exists()
