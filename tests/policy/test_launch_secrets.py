"""Secrets stay secret, agent URLs are checked, the context flag is the context
operation's, and a restart refuses what the launch policy refuses now."""

from __future__ import annotations

import json
import socket

import pytest
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from base.actor import Actor, acting_as
from base.errors import DomainError
from base.secrets import placeholder, redact
from catalog.models import Node, Profile
from catalog.services.catalog import profile_save
from operations.services.start import restart_start
from tests.support import builders as b

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """Users are made per case here: hash their passwords cheaply (tests only)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


KEY = "sk-live-0123456789abcdef"


def _api(*perms: str) -> APIClient:
    client = APIClient()
    client.force_authenticate(b.user("editor", *perms))
    return client


@pytest.fixture
def admin_client(db) -> Client:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser("root", "root@example.org", "pw-for-tests-only-123")
    client = Client()
    client.force_login(user)
    return client


def test_a_secret_value_is_write_only_in_the_api_and_fingerprinted_in_the_audit_log():
    model = b.llama_8b()
    client = _api("catalog.add_profile", "catalog.change_profile", "catalog.view_profile")
    created = client.post(
        "/api/profiles/",
        {
            "model": model.name,
            "name": "keyed",
            "engine": "vllm",
            "gpu_class": b.gpu_class().name,
            "env": {"VLLM_API_KEY": KEY, "HF_HUB_OFFLINE": "1"},
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    assert KEY not in created.content.decode()
    assert created.json()["env"] == {"VLLM_API_KEY": placeholder(KEY), "HF_HUB_OFFLINE": "1"}
    profile = Profile.objects.get(name="keyed")
    assert profile.env["VLLM_API_KEY"] == KEY

    shown = client.get(f"/api/profiles/{profile.pk}/").json()
    # Sending back what was shown keeps the secret and changes nothing else.
    again = client.patch(f"/api/profiles/{profile.pk}/", {"env": shown["env"]}, format="json")
    assert again.status_code == 200
    profile.refresh_from_db()
    assert (profile.env["VLLM_API_KEY"], profile.revision) == (KEY, 1)

    entries = AuditEntry.objects.filter(object_type="profile")
    assert entries.count() == 1
    assert KEY not in json.dumps([e.after for e in entries] + [e.before for e in entries])
    assert entries.get().after["env"]["VLLM_API_KEY"].startswith("hmac:")  # keyed: no guess confirmed offline


def test_the_admin_shows_a_placeholder_and_keeps_the_secret_when_it_is_sent_back(admin_client):
    model = b.llama_8b()
    profile = b.profile(model, "keyed", env={"VLLM_API_KEY": KEY})
    page = admin_client.get(f"/admin/catalog/profile/{profile.pk}/change/").content.decode()
    assert KEY not in page
    assert placeholder(KEY) in page.replace("&lt;", "<").replace("&gt;", ">")

    form = {
        "model": str(model.pk),
        "name": "keyed",
        "engine": "vllm",
        "gpu_class": str(profile.gpu_class_id),
        "gpus_per_node": "1",
        "tp": "1",
        "nodes": "1",
        "pp": "0",
        "args": json.dumps(["--max-num-seqs", "16"]),
        "env": json.dumps({"VLLM_API_KEY": placeholder(KEY)}),
    }
    response = admin_client.post(f"/admin/catalog/profile/{profile.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    profile.refresh_from_db()
    assert (profile.env, profile.args) == ({"VLLM_API_KEY": KEY}, ["--max-num-seqs", "16"])
    assert KEY not in json.dumps(list(AuditEntry.objects.values_list("before", "after")))


def test_redaction_replaces_every_secret_in_a_reason():
    text = f"engine said: bad key {KEY}; retrying with {KEY}"
    assert redact(text, [KEY]) == "engine said: bad key ***; retrying with ***"


def test_the_agent_token_is_write_only_in_the_admin_and_needed_again_for_a_new_url(admin_client):
    node = b.node("gpu-1", agent_token="the-old-agent-token-0123456789abcdef")
    page = admin_client.get(f"/admin/catalog/node/{node.pk}/change/").content.decode()
    assert "the-old-agent-token-0123456789abcdef" not in page

    base = {"name": "gpu-1", "state": "ready", "cards-TOTAL_FORMS": "0", "cards-INITIAL_FORMS": "0"}
    moved = admin_client.post(
        f"/admin/catalog/node/{node.pk}/change/",
        {**base, "agent_url": "http://10.0.0.7:9101", "agent_token": ""},
    )
    assert moved.status_code == 200
    assert "Changing the agent URL needs the agent token again" in moved.content.decode()
    assert "10.0.0.7" in moved.content.decode()  # what was typed is kept
    node.refresh_from_db()
    assert node.agent_url == "http://127.0.0.1:9"

    kept = admin_client.post(
        f"/admin/catalog/node/{node.pk}/change/", {**base, "agent_url": node.agent_url, "agent_token": ""}
    )
    assert kept.status_code == 302
    node.refresh_from_db()
    assert node.agent_token == "the-old-agent-token-0123456789abcdef"


def test_changing_an_agent_url_through_the_api_needs_the_token_again():
    node = b.node("gpu-1")
    client = _api("catalog.change_node", "catalog.view_node")
    response = client.patch(f"/api/nodes/{node.name}/", {"agent_url": "http://10.0.0.7:9101"}, format="json")
    assert response.status_code == 400
    assert "agent_token" in response.json()["detail"]
    ok = client.patch(
        f"/api/nodes/{node.name}/",
        {"agent_url": "http://10.0.0.7:9101", "agent_token": "a-new-agent-token-0123456789abcdef"},
        format="json",
    )
    assert ok.status_code == 200, ok.content
    assert "a-new-agent-token" not in ok.content.decode()


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://[fe80::1]:9101",
        "http://metadata.google.internal",
        "http://0.0.0.0:9101",
        "file:///etc/passwd",
        "http://user:pw@10.0.0.7:9101",
    ],
)
def test_an_agent_url_to_a_link_local_or_metadata_address_is_refused(url):
    client = _api("catalog.add_node")
    before = (Node.objects.count(), AuditEntry.objects.count())
    response = client.post(
        "/api/nodes/", {"name": "evil", "agent_url": url, "agent_token": "t" * 32}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["code"] in ("refused_agent_url", "invalid")
    assert (Node.objects.count(), AuditEntry.objects.count()) == before


def test_agent_hosts_limit_the_hosts_an_agent_url_may_name(settings, monkeypatch):
    settings.LLMGW_AGENT_HOSTS = ["10.0.0.0/8", "*.gpu.example"]
    real = socket.getaddrinfo
    # The one name resolves, here, to an address inside the fleet's networks (catalog/agent_address.py).
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, port, *a, **k: (
            [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.9.9.9", port))]
            if host == "n1.gpu.example"
            else real(host, port, *a, **k)
        ),
    )
    client = _api("catalog.add_node")
    for n, (url, status) in enumerate(
        [
            ("http://10.1.2.3:9101", 201),
            ("https://n1.gpu.example:9101", 201),
            ("http://192.168.1.5:9101", 400),
        ]
    ):
        response = client.post(
            "/api/nodes/", {"name": f"n{n}", "agent_url": url, "agent_token": "t" * 32}, format="json"
        )
        assert response.status_code == status, (url, response.content)


# -- the context flag ----------------------------------------------------------------------------


def test_only_the_context_operation_writes_the_context_flag():
    model = b.llama_8b()
    profile = b.profile(model, "h100", args=["--max-model-len", "8192"])
    client = _api("catalog.change_profile", "catalog.view_profile")

    carried = client.patch(
        f"/api/profiles/{profile.pk}/",
        {"args": ["--max-model-len", "8192", "--enforce-eager"]},
        format="json",
    )
    changed = client.patch(
        f"/api/profiles/{profile.pk}/", {"args": ["--max-model-len", "4096"]}, format="json"
    )

    assert carried.status_code == 200, carried.content
    assert changed.status_code == 400
    assert "--max-model-len is refused for vllm" in changed.json()["detail"]
    assert f"/api/models/{model.name}/context/" in changed.json()["detail"]
    profile.refresh_from_db()
    assert profile.args == ["--max-model-len", "8192", "--enforce-eager"]


def test_the_context_operation_writes_it_but_never_above_the_models_length():
    model = b.llama_8b(context_length=32768)
    profile = b.profile(model, "h100")
    profile.args = ["--max-model-len", "65536"]
    with acting_as(Actor(via="cli", name="ops")), pytest.raises(DomainError) as caught:
        profile_save(instance=profile, context_from_operation=True)
    assert "above the model's context length, 32768" in caught.value.message


# -- restarts --------------------------------------------------------------------------------------


def test_a_profile_saved_before_the_rules_is_refused_at_restart_with_the_reason():
    model = b.llama_8b()
    node = b.node("gpu-1")
    # Written behind the policy's back, as a profile saved before a rule changed would be.
    profile = b.profile(model, "h100", args=["--trust-remote-code"], env={"PYTHONUSERBASE": "/tmp/u"})
    b.replica(profile, node, [0], state="ready")
    profile.revision = 2
    profile.save()
    before = AuditEntry.objects.count()

    with acting_as(Actor(via="cli", name="ops")), pytest.raises(DomainError) as caught:
        restart_start(model_name=model.name)

    assert caught.value.code == "refused_arg"
    assert "--trust-remote-code is refused for vllm" in caught.value.message
    assert "PYTHONUSERBASE" in caught.value.message
    assert AuditEntry.objects.count() == before


def test_a_model_whose_source_is_not_allowed_is_refused_at_restart():
    model = b.llama_8b(source="/etc")
    node = b.node("gpu-1")
    profile = b.profile(model, "h100", args=["--max-num-seqs", "8"])
    b.replica(profile, node, [0], state="ready")
    profile.revision = 2
    profile.save()
    with acting_as(Actor(via="cli", name="ops")), pytest.raises(DomainError) as caught:
        restart_start(model_name=model.name)
    assert caught.value.code == "refused_source"


def test_a_shape_import_refuses_a_source_outside_the_model_roots(tmp_path, settings):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    settings.LLMGW_MODEL_ROOTS = ("/srv/models",)
    (tmp_path / "config.json").write_text("{}")
    before = AuditEntry.objects.count()
    with pytest.raises(CommandError, match="not under the model roots"):
        call_command("import_model", "elsewhere", str(tmp_path))
    assert AuditEntry.objects.count() == before
