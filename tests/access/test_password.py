"""A user's own password, on a page any signed-in user opens (OWASP ASVS 4.0.3 V2.1.5, V2.1.6): the
current one required and checked under the sign-in's limits, the new one held to the validators, the
user's other sessions signed out, the change audited without either password."""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt
from django.test import Client

from audit.models import AuditEntry
from tests.support import builders as b

pytestmark = pytest.mark.django_db

OLD = "pw-for-tests-only-123"
NEW = "a-new-one-for-tests-456"


@pytest.fixture(autouse=True)
def quick_hashes(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def signed_in() -> Client:
    client = Client()
    assert client.post("/accounts/login/", {"username": "vera", "password": OLD}).status_code == 302
    return client


def change(client: Client, current: str, new: str = NEW, again: str | None = None):
    return client.post("/account/password/", {"current": current, "new": new, "again": again or new})


def test_a_viewer_changes_their_password_and_their_other_sessions_end():
    b.user("vera")  # a viewer: no admin, where the only password form was
    here, elsewhere = signed_in(), signed_in()
    assert here.get("/account/password/").status_code == 200
    response = change(here, OLD)
    assert response.status_code == 302
    assert here.get("/account/password/").status_code == 200  # this session stays
    assert elsewhere.get("/account/password/").status_code == 302  # the other is sent to sign in
    assert Client().post("/accounts/login/", {"username": "vera", "password": NEW}).status_code == 302
    assert Client().post("/accounts/login/", {"username": "vera", "password": OLD}).status_code == 200
    (entry,) = AuditEntry.objects.filter(object_type="user")
    assert (entry.object_key, entry.message) == ("vera", "changed their password")
    assert OLD not in str(entry.__dict__) and NEW not in str(entry.__dict__)


@pytest.mark.parametrize(
    ("current", "new", "again", "says"),
    [
        ("not-the-password", NEW, NEW, "The current password is not right"),
        (OLD, "short-11-ch", "short-11-ch", "at least 12 characters"),
        (OLD, NEW, NEW + "x", "The two new passwords differ"),
    ],
)
def test_a_wrong_current_password_or_a_weak_new_one_is_refused_and_changes_nothing(current, new, again, says):
    b.user("vera")
    client = signed_in()
    response = change(client, current, new, again)
    assert response.status_code == 400 and says in response.content.decode()
    assert Client().post("/accounts/login/", {"username": "vera", "password": OLD}).status_code == 302
    assert not AuditEntry.objects.filter(object_type="user").exists()


def test_guessing_the_current_password_here_meets_the_sign_in_limits():
    b.user("vera")
    client = signed_in()
    statuses = [change(client, f"guess-{n}").status_code for n in range(6)]
    assert statuses == [400, 400, 400, 400, 429, 429]  # the fifth failure: the next try waits
    assert AccessAttempt.objects.get().failures_since_start == 5
