"""Sign-in limits a stranger cannot turn against a user (access/signin.py): failed sign-ins counted per
user and address, the address the proxy saw when (and only when) LLMGW_BEHIND_PROXY says one is in
front; past the limit each try waits, doubling, never a lock; failures from many addresses hold up
new addresses only. And the API's rate limit.

"Time passes" here by moving the recorded failures and sign-ins back, never by sleeping."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt, AccessLog
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db.models import F, Sum
from django.test import Client
from rest_framework.test import APIClient

from tests.support import builders as b

# What is counted and refused does not depend on the hasher: these sign in with the tests' fast one
# (tests/conftest.py), as PBKDF2's quarter second a try made them the suite's longest, with about 90
# tries between them, on each database.
pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests-only-123"
USERS_ADDRESS = "203.0.113.10"
STRANGER = "198.51.100.66"
PROXY = "10.0.0.2"


@pytest.fixture(autouse=True)
def quick_hashes(settings):
    """Every sign-in runs the password hasher and these tests make a few hundred: a quick one."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def sign_in(
    password: str, *, address: str = USERS_ADDRESS, via_proxy: bool = False, page: str = "/accounts/login/"
) -> Any:
    """alice's sign-in from ``address``: her connection's own, or behind the proxy the one it appended."""
    client = (
        Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=address) if via_proxy else Client(REMOTE_ADDR=address)
    )
    response: Any = client.post(page, {"username": "alice", "password": password})
    response.signed_in = "_auth_user_id" in client.session
    return response


def time_passes(seconds: float) -> None:
    delta = timedelta(seconds=seconds)
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - delta)
    AccessLog.objects.update(attempt_time=F("attempt_time") - delta)


def counted(**where: str) -> int:
    return AccessAttempt.objects.filter(**where).aggregate(n=Sum("failures_since_start"))["n"] or 0


def guess(times: int, *, address: str, via_proxy: bool = False) -> None:
    """A patient stranger's ``times`` wrong passwords for alice from ``address``, each wait waited out."""
    for n in range(times):
        response = sign_in(f"guess-{n}", address=address, via_proxy=via_proxy)
        assert response.status_code in (200, 429) and not response.signed_in
        time_passes(int(response.get("Retry-After", "0")))


@pytest.mark.parametrize("via_proxy", [False, True], ids=["direct", "behind-the-proxy"])
def test_a_strangers_twenty_failures_from_another_address_leave_the_user_able_to_sign_in(settings, via_proxy):
    settings.LLMGW_BEHIND_PROXY = via_proxy
    b.user("alice")
    guess(20, address=STRANGER, via_proxy=via_proxy)
    assert counted(ip_address=STRANGER) == 20
    assert sign_in("another-guess", address=STRANGER, via_proxy=via_proxy).status_code == 429
    response = sign_in(PASSWORD, address=USERS_ADDRESS, via_proxy=via_proxy)
    assert response.status_code == 302 and response.signed_in


def test_without_the_proxy_setting_a_forwarded_for_header_is_ignored(settings):
    settings.LLMGW_BEHIND_PROXY = False
    b.user("alice")
    client = Client(REMOTE_ADDR=STRANGER)
    for n in range(5):  # each try claims another address
        client.post(
            "/accounts/login/", {"username": "alice", "password": "x"}, HTTP_X_FORWARDED_FOR=f"192.0.2.{n}"
        )
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {STRANGER}
    claimed = client.post(
        "/accounts/login/", {"username": "alice", "password": "x"}, HTTP_X_FORWARDED_FOR=USERS_ADDRESS
    )
    assert claimed.status_code == 429  # still the stranger's count, whatever the header says


def test_behind_the_proxy_the_address_the_proxy_appended_is_counted(settings):
    settings.LLMGW_BEHIND_PROXY = True
    b.user("alice")
    # Each client wrote a first entry of its own; the proxy appended the address it was connected from.
    for n in range(5):
        sign_in("x", address=f"{USERS_ADDRESS}, {STRANGER}", via_proxy=True)
        sign_in("x", address=f"192.0.2.{n}, {STRANGER}", via_proxy=True)
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {STRANGER}
    assert sign_in(PASSWORD, address=STRANGER, via_proxy=True).status_code == 429
    assert sign_in(PASSWORD, address=USERS_ADDRESS, via_proxy=True).signed_in


@pytest.mark.parametrize("page", ["/accounts/login/", "/admin/login/"])
def test_past_the_limit_each_try_waits_twice_as_long_and_after_the_wait_the_right_password_signs_in(
    page, monkeypatch
):
    # The first wait made 10 s rather than 1: a failure's own request, which decides whether the next
    # try waits, took over a second on a CI machine loaded to 13, and the 1 s wait had run out by then.
    monkeypatch.setattr("access.signin.FIRST_WAIT", timedelta(seconds=10))
    b.user("alice", roles=("editor",))
    for n in range(4):
        assert sign_in(f"wrong-{n}", page=page).status_code == 200
    waits = []
    for n in range(4):
        response = sign_in(f"wrong-again-{n}", page=page)
        assert response.status_code == 429
        waits.append(int(response["Retry-After"]))
        text = response.content.decode()
        assert re.search(
            r"from your address: try again after \d\d:\d\d:\d\d UTC \(in \d+ seconds?\)", text
        ), text
        # Before the wait is over even the right password is refused, and the try is not counted.
        before = counted()
        early = sign_in(PASSWORD, page=page)
        assert early.status_code == 429 and not early.signed_in and counted() == before
        time_passes(waits[-1])
    assert waits == [10, 20, 40, 80]
    response = sign_in(PASSWORD, page=page)
    assert response.status_code == 302 and response.signed_in
    assert counted() == 0  # the success cleared the count


def test_failures_from_many_addresses_hold_up_new_addresses_but_not_one_the_user_signed_in_from(settings):
    settings.LLMGW_SIGNIN_ACCOUNT_FAILURES = 10
    b.user("alice")
    assert sign_in(PASSWORD, address=USERS_ADDRESS).signed_in  # alice's own address, known from now on
    for n in range(9):
        assert sign_in("guess", address=f"198.51.100.{n}").status_code == 200
    assert sign_in("guess", address="198.51.100.9").status_code == 429  # the tenth: new addresses wait
    new = sign_in(PASSWORD, address="192.0.2.200")
    assert new.status_code == 429 and not new.signed_in
    assert "from many addresses" in new.content.decode() and int(new["Retry-After"]) == 1
    assert sign_in(PASSWORD, address=USERS_ADDRESS).signed_in
    time_passes(1)
    assert sign_in(PASSWORD, address="192.0.2.200").signed_in  # after the wait, from anywhere


def test_a_success_before_the_limit_clears_the_count():
    b.user("alice")
    for n in range(4):
        assert sign_in(f"wrong-{n}").status_code == 200
    assert sign_in(PASSWORD).signed_in
    for n in range(4):
        assert sign_in(f"again-{n}").status_code == 200


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


def test_a_password_is_at_least_twelve_characters_wherever_one_is_set():
    # What the admin's "add user" and "change password" forms check (OWASP ASVS 4.0.3 V2.1.1).
    with pytest.raises(ValidationError, match="at least 12 characters"):
        validate_password("k9!Qz7#mW2x")
    validate_password("k9!Qz7#mW2xR")
