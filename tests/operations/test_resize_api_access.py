"""POST /api/models/{name}/gpus/ and /context/: anonymous, signed in without the resize permission,
with it, and with it through a group. A refused request changes nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from rest_framework.test import APIClient

from audit.models import AuditEntry
from tests.operations.resize_api_support import (
    client_for,
    context_url,
    gpus_url,
    llama_on_h100,
    resizer,
    saved_state,
    user,
)

pytestmark = pytest.mark.django_db


# -- access --------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, body", [(gpus_url(), {"gpus": 2}), (context_url(), {"tokens": 8192})])
def test_anonymous_requests_are_refused_with_the_error_shape_and_change_nothing(url, body):
    llama_on_h100()
    before = saved_state()
    response = APIClient().post(url, body, format="json")
    assert response.status_code in (401, 403)
    assert response.json()["code"] == "not_authenticated"
    assert "credentials" in response.json()["detail"].lower()
    assert saved_state() == before


@pytest.mark.parametrize("url, body", [(gpus_url(), {"gpus": 2}), (context_url(), {"tokens": 8192})])
def test_signed_in_without_the_resize_permission_is_forbidden_and_changes_nothing(url, body):
    llama_on_h100()
    before = saved_state()
    # Being able to edit profiles is not being able to resize.
    response = client_for(user("bob", "catalog.change_profile")).post(url, body, format="json")
    assert response.status_code == 403
    assert response.json() == {
        "detail": "You need the permission 'Can resize a model or change its context' "
        "(catalog.resize_model): the operator role gives it.",
        "code": "permission_denied",
    }
    assert saved_state() == before


def test_even_a_dry_run_needs_the_resize_permission():
    llama_on_h100()
    response = client_for(user("bob")).post(gpus_url(), {"gpus": 2, "dry_run": True}, format="json")
    assert response.status_code == 403


@pytest.mark.parametrize("url, body", [(gpus_url(), {"gpus": 2}), (context_url(), {"tokens": 8192})])
def test_signed_in_with_the_resize_permission_works(url, body):
    llama_on_h100()
    response = client_for(resizer()).post(url, body, format="json")
    assert response.status_code == 200, response.content
    assert AuditEntry.objects.get().user.username == "alice"


def test_the_resize_permission_through_a_group_works_too():
    llama_on_h100()
    group = Group.objects.create(name="operators")
    group.permissions.add(Permission.objects.get(codename="resize_model"))
    carol = user("carol")
    carol.groups.add(group)
    assert client_for(carol).post(gpus_url(), {"gpus": 2}, format="json").status_code == 200
