"""The signed-in clients the operator pages' tests use: a viewer, and an operator who may resize and
restart."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.support import builders as b
from tests.web.pages_support import signed_in


@pytest.fixture
def viewer() -> Client:
    return signed_in(b.user("viewer"))


@pytest.fixture
def operator_user():
    return b.user("operator", "catalog.resize_model", "catalog.restart_model")


@pytest.fixture
def operator(operator_user) -> Client:
    return signed_in(operator_user)
