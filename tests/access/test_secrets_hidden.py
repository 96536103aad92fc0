"""Secrets are write-only on every page: each admin view (changelist, change form, history, delete
confirmation of every registered model) and every page and API URL, opened by each role over a
catalog that holds known secrets (a node's agent token, a profile's engine API key and HF_TOKEN, a
declared model's profile's key, and a restart step's spec carrying them), answers none of them.

The URLs are the access matrix's (tests/access/test_access_matrix.py), generated from the URL
configuration, so a new page is opened here too without a line added.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from django.test import Client

from catalog.models import Node, Profile
from catalog.services import catalog as services
from operations.models import RestartStep
from tests.access.test_access_matrix import CASES, ROLES, url_of, world  # noqa: F401  (world: the matrix's fixture)
from tests.support import builders as b

pytestmark = pytest.mark.django_db

AGENT_TOKEN = "agent-TOKEN-of-the-secrets-test-0123456789"
HF_TOKEN = "hf_SecretsTestHuggingFaceToken0123456789"
API_KEY = "vllm-SecretsTestApiKey-0123456789abcdef"
DECLARED_KEY = "declared-SecretsTestApiKey-0123456789xyz"
SECRETS = (AGENT_TOKEN, HF_TOKEN, API_KEY, DECLARED_KEY)


def _forms(secret: str) -> set[str]:
    """The secret as it would show on a page: as is, upper- or lower-cased, base64'd."""
    return {secret, secret.upper(), secret.lower(), base64.b64encode(secret.encode()).decode()}


FORMS = {form: secret for secret in SECRETS for form in _forms(secret)}


@pytest.fixture
def secret_world(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The matrix's world, its node, profile and restart holding the secrets (the node's and another
    profile's written through the services, so the audit log has their entries), and a declared
    model whose profile holds one."""
    built: dict[str, Any] = request.getfixturevalue("world")
    node = built["objects"]["catalog.node"]
    node.agent_token = AGENT_TOKEN
    services.node_save(instance=node)
    profile = built["objects"]["catalog.profile"]
    profile.env = {"HF_TOKEN": HF_TOKEN, "VLLM_API_KEY": API_KEY, "HF_HUB_OFFLINE": "1"}
    Profile.objects.filter(pk=profile.pk).update(env=profile.env)  # its model's restart is queued
    # The same secrets on another model's profile, saved (and so audited) by the service.
    audited = Profile(
        model=b.llama_8b("audited-llama"), name="h100", engine="vllm", gpu_class=profile.gpu_class
    )
    audited.env = dict(profile.env)
    services.profile_save(instance=audited)
    operation = built["objects"]["operations.restartoperation"]
    RestartStep.objects.create(
        operation=operation,
        old_replica=built["objects"]["catalog.replica"],
        node=node.name,
        cards=[1],
        state="failed",
        reason="the engine could not start",
        spec={"engine": "vllm", "env": dict(profile.env), "args": [], "cards": [1], "port": 8001},
    )
    declared = b.llama_8b("declared-llama", declared=True, declared_in="cluster.toml")
    declared_profile = b.profile(declared, "h100", env={"VLLM_API_KEY": DECLARED_KEY})
    built["extra_urls"] = [
        f"/admin/catalog/profile/{declared_profile.pk}/change/",
        f"/admin/catalog/profile/{declared_profile.pk}/history/",
        f"/admin/catalog/servedmodel/{declared.pk}/change/",
        f"/admin/catalog/servedmodel/{declared.pk}/history/",
        f"/models/{declared.name}/",
        f"/api/models/{declared.name}/",
        f"/api/profiles/{declared_profile.pk}/",
        "/audit/export.jsonl",
        "/api/audit/export.jsonl",
    ]
    assert Node.objects.get(pk=node.pk).agent_token == AGENT_TOKEN
    assert Profile.objects.get(pk=profile.pk).env["VLLM_API_KEY"] == API_KEY
    return built


def _urls(opened: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """Every GET of the matrix, the pages also as htmx asks for their parts, and the extra URLs."""
    out: list[tuple[str, dict[str, str]]] = []
    for case in CASES:
        if case.method != "GET" or case.route.name in ("admin:logout", "logout"):
            continue
        url = url_of(case, opened)
        out.append((url, {}))
        if not case.route.in_admin and not url.startswith("/api/"):
            out.append((url, {"HTTP_HX_REQUEST": "true"}))
    out += [(url, {}) for url in opened["extra_urls"]]
    return out


def _found(body: str) -> list[str]:
    return sorted({FORMS[form] for form in FORMS if form in body})


@pytest.mark.parametrize("role", ROLES)
def test_no_page_shows_a_secret_to_any_role(secret_world: dict[str, Any], role: str):
    client = Client()
    client.force_login(secret_world["users"][role])
    urls = _urls(secret_world)
    shown = []
    opened = 0
    for url, headers in urls:
        response = client.get(url, **headers)  # type: ignore[arg-type]
        body = b"".join(response) if response.streaming else response.content
        found = _found(body.decode("utf-8", "replace"))
        if response.status_code == 200:
            opened += 1
        if found:
            shown.append(f"{url} ({response.status_code}): {', '.join(s[:12] + '…' for s in found)}")
    assert shown == [], f"{role} read a secret on {len(shown)} page(s):\n" + "\n".join(shown)
    assert opened > 10  # the role did open pages: the check is not vacuous


def test_the_admins_read_only_forms_show_the_placeholder(secret_world: dict[str, Any]):
    """A lead opens a node and a profile read-only: each secret is there as its placeholder."""
    from django.utils.html import escape

    from base.secrets import placeholder

    client = Client()
    client.force_login(secret_world["users"]["lead"])
    node = secret_world["objects"]["catalog.node"]
    profile = secret_world["objects"]["catalog.profile"]
    node_page = client.get(f"/admin/catalog/node/{node.pk}/change/").content.decode()
    profile_page = client.get(f"/admin/catalog/profile/{profile.pk}/change/").content.decode()
    assert escape(placeholder(AGENT_TOKEN)) in node_page
    assert escape(placeholder(API_KEY)) in profile_page and escape(placeholder(HF_TOKEN)) in profile_page
