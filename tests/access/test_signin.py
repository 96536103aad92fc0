"""Sign-in protection: failed sign-ins counted per user and address on both sign-in pages (the
twenty-first in the lockout window refused even with the right password, saying when to try again),
and the API's rate limits."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.support import builders as b

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests-only-123"


@pytest.mark.parametrize("page", ["/accounts/login/", "/admin/login/"])
def test_the_twenty_first_failed_sign_in_is_refused_even_with_the_right_password(page):
    b.user("alice", roles=("editor",))
    client = Client()
    for n in range(1, 21):
        response = client.post(page, {"username": "alice", "password": f"wrong-{n}"})
        assert response.status_code == (429 if n == 20 else 200), n
    response = client.post(page, {"username": "alice", "password": PASSWORD})
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session
    text = response.content.decode()
    assert re.search(r"refused until it is unlocked, at \d\d:\d\d UTC \(in about 15 minutes\)", text), text
    # Another address, or another user from this one, is not locked out.
    other = Client(REMOTE_ADDR="10.1.2.3")
    assert other.post("/accounts/login/", {"username": "alice", "password": PASSWORD}).status_code == 302


def test_a_success_before_the_limit_resets_the_count():
    b.user("alice")
    client = Client()
    for n in range(19):
        client.post("/accounts/login/", {"username": "alice", "password": f"wrong-{n}"})
    assert client.post("/accounts/login/", {"username": "alice", "password": PASSWORD}).status_code == 302
    client = Client()
    for n in range(19):
        assert client.post("/accounts/login/", {"username": "alice", "password": f"x{n}"}).status_code == 200


def test_the_api_answers_429_past_its_rate_in_the_one_error_shape(settings):
    settings.LLMGW_API_RATE_USER = 3
    api = APIClient()
    api.force_authenticate(b.user("bot"))
    assert [api.get("/api/whoami/").status_code for _ in range(3)] == [200, 200, 200]
    response = api.get("/api/whoami/")
    assert response.status_code == 429
    body = response.json()
    assert body["code"] == "throttled" and "Expected available in" in body["detail"]
    assert int(response["Retry-After"]) > 0
