from __future__ import annotations

import pytest
from django.db import connection

from catalog.actor import Actor, acting_as


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    if not settings.configured or connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(
        reason="needs PostgreSQL: row locks and concurrent connections; SQLite runs one writer at a time"
    )
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def actor(db):
    """Acting as a named test command, as a management command would."""
    with acting_as(Actor(via="cli", name="pytest")) as a:
        yield a
