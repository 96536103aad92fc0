"""Fixtures every test module may use, by name (pytest finds them here)."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import import_module
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, settings

from audit.actor import Actor, acting_as
from tests.restart_support import port_block

# Hypothesis's timing checks (a 200 ms deadline per example, "input generation is slow") judge the
# machine, not the code: on a shared two-core CI box they fail tests whose properties hold. The
# properties and the example counts stay as they are; only the clock is taken out of the verdict.
settings.register_profile(
    "llmgw", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("llmgw")


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


@pytest.fixture(scope="session", autouse=True)
def _flush_past_the_append_only_triggers() -> Iterator[None]:
    """pytest-django empties the tables after a transactional test with one ``TRUNCATE``, which the
    audit log's statement trigger refuses, as it must for everyone else. The tests connect as a
    superuser, who may lift the triggers for that one transaction (``session_replication_role``): the
    flush alone, never a test's own SQL."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.sql_flush

    def sql_flush(self: Any, style: Any, tables: Any, **kwargs: Any) -> list[str]:
        statements = original(self, style, tables, **kwargs)
        # RESET ROLE first: a test run as the application's role (``as_app_role``) hands the connection back.
        return (
            ["RESET ROLE", "SET LOCAL session_replication_role = replica", *statements]
            if statements
            else statements
        )

    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]
    yield
    DatabaseOperations.sql_flush = original  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _no_answers_kept_from_another_test() -> Iterator[None]:
    """What versions/cache.py keeps lives in this process across tests, whose databases are emptied
    (and the version counters with them) between them: each test starts with none kept."""
    from django.core.cache import caches

    caches["answers"].clear()
    yield


@pytest.fixture
def as_app_role(transactional_db: None) -> Iterator[str | None]:
    """On PostgreSQL, the test runs as the application's role, set up as the README says
    (``db_app_role``): every connection, the test's and its threads', ``SET ROLE`` to a role that owns
    nothing. None on SQLite, which has no roles."""
    if connection.vendor != "postgresql":
        yield None
        return
    import uuid

    from django.core.management import call_command
    from django.db.backends.signals import connection_created

    name = f"llmgw_app_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {name} NOLOGIN")
    call_command("db_app_role", name, stdout=__import__("io").StringIO())

    def become(sender: Any = None, connection: Any = connection, **kwargs: Any) -> None:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"SET ROLE {name}")

    connection_created.connect(become, weak=False)
    become()
    try:
        yield name
    finally:
        connection_created.disconnect(become)
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
            cursor.execute(f"DROP OWNED BY {name}")
            cursor.execute(f"DROP ROLE {name}")


@pytest.fixture
def actor(db):
    """Acting as a named test command, as a management command would."""
    with acting_as(Actor(via="cli", name="pytest")) as a:
        yield a


@pytest.fixture
def fast_restarts(settings: Any) -> Any:
    """Short polls and heartbeats, and replica ports nothing else on this host is likely to use."""
    settings.LLMGW_OPERATION_POLL_SECONDS = 0.1
    settings.LLMGW_OPERATION_HEARTBEAT_SECONDS = 0.5
    settings.LLMGW_OPERATION_STALE_SECONDS = 5
    settings.LLMGW_OPERATION_SWEEP_SECONDS = 1
    settings.LLMGW_AGENT_TIMEOUT_SECONDS = 3.0
    settings.LLMGW_AGENT_WAIT_SECONDS = 1.0
    settings.LLMGW_AGENT_STOP_SECONDS = 4.0
    settings.LLMGW_AGENT_ABSENT_SECONDS = 2.0
    settings.LLMGW_RESTART_SETTLE_SECONDS = 0.2
    settings.LLMGW_RECONCILE_SECONDS = 1.0
    settings.LLMGW_REPLICA_PORT_BASE = port_block()
    return settings


@pytest.fixture
def audit_flushable(transactional_db: None) -> Iterator[None]:
    """On SQLite, the teardown flush of a transactional test DELETEs every row,
    which the audit log's append-only triggers refuse (PostgreSQL's TRUNCATE
    does not fire them). Empty the log with the triggers lifted, then put them back."""
    yield
    if connection.vendor != "sqlite":
        return
    migration = import_module("catalog.migrations.0002_audit_append_only")
    with connection.cursor() as cursor:
        for sql in migration.SQLITE_DOWN:
            cursor.execute(sql)
        cursor.execute("DELETE FROM catalog_auditentry")
        for sql in migration.SQLITE_UP:
            cursor.execute(sql)
