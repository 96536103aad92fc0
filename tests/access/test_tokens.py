"""API tokens for automation: made by the command or the user's page, shown once, stored hashed,
working until they expire or are revoked; each creation and revocation audited."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from access.models import Token
from audit.models import AuditEntry
from tests.support import builders as b

pytestmark = pytest.mark.django_db


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("token", "--as", "pytest", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def whoami(secret: str) -> int:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    return c.get("/api/whoami/").status_code


def test_a_token_made_by_the_command_works_and_its_secret_is_not_in_the_database():
    b.user("bot")
    secret = command("create", "bot", "--name", "ci-deploy", "--days", "7")
    assert secret.startswith("llmgw_") and len(secret) > 40
    assert whoami(secret) == 200
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert c.get("/api/models/").status_code == 200  # with the user's role: a viewer reads
    token = Token.objects.get()
    assert (token.name, token.user.username) == ("ci-deploy", "bot")
    assert timedelta(days=6, hours=23) < token.expiry - timezone.now() <= timedelta(days=7)
    stored = json.dumps(list(Token.objects.values()), default=str)
    logged = json.dumps(list(AuditEntry.objects.values()), default=str)
    assert secret not in stored and secret not in logged
    assert secret[:15] == token.token_key and token.digest != secret


def test_an_expired_token_is_refused():
    secret = command("create", b.user("bot").username, "--name", "ci", "--days", "1")
    assert whoami(secret) == 200
    Token.objects.update(expiry=timezone.now() - timedelta(seconds=1))
    assert whoami(secret) == 401


def test_a_revoked_token_is_refused_at_once_and_both_are_audited():
    b.user("bot")
    secret = command("create", "bot", "--name", "ci", "--days", "30")
    assert "bot" in command("list") and "ci" in command("list", "bot")
    assert command("revoke", "bot", "ci") == "Revoked 'ci' of bot: it no longer works."
    assert whoami(secret) == 401
    entries = AuditEntry.objects.filter(object_type="token").order_by("id")
    assert [(e.action, e.object_key, e.via) for e in entries] == [
        ("create", "bot/ci", "cli"),
        ("delete", "bot/ci", "cli"),
    ]


@pytest.mark.parametrize(
    "args, sentence",
    [
        (["--days", "0"], "A token expires in 1 to 365 days, not 0"),
        (["--days", "366"], "A token expires in 1 to 365 days, not 366"),
        (["--name", " "], "A token needs a name"),
    ],
)
def test_a_bad_token_request_says_why_and_makes_nothing(args, sentence):
    b.user("bot")
    base = {"--name": "ci", "--days": "30"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    with pytest.raises(CommandError, match=sentence):
        command("create", "bot", *[x for kv in base.items() for x in kv])
    assert not Token.objects.exists() and not AuditEntry.objects.filter(object_type="token").exists()


def test_a_second_token_of_the_same_name_is_refused():
    b.user("bot")
    command("create", "bot", "--name", "ci", "--days", "30")
    with pytest.raises(CommandError, match="bot already has a token named 'ci'"):
        command("create", "bot", "--name", "ci", "--days", "30")
    assert Token.objects.count() == 1


def test_the_tokens_page_shows_the_secret_once_lists_and_revokes_only_ones_own():
    alice, mallory = b.user("alice"), b.user("mallory")
    page = Client()
    page.force_login(alice)
    response = page.post("/account/tokens/", {"name": "laptop", "days": "3"})
    assert response.status_code == 200
    secret = response.context["secret"]
    assert secret in response.content.decode() and whoami(secret) == 200
    again = page.get("/account/tokens/").content.decode()
    assert "laptop" in again and secret not in again and secret[:15] in again

    other = Client()
    other.force_login(mallory)
    assert other.post(f"/account/tokens/{secret[:15]}/revoke/").status_code == 404
    assert whoami(secret) == 200
    assert page.post(f"/account/tokens/{secret[:15]}/revoke/").status_code == 302
    assert whoami(secret) == 401


def test_the_tokens_page_refuses_a_bad_expiry_with_a_sentence():
    page = Client()
    page.force_login(b.user("alice"))
    response = page.post("/account/tokens/", {"name": "laptop", "days": "9999"})
    assert response.status_code == 400
    assert "At most 365 days" in response.content.decode()
    assert not Token.objects.exists()
