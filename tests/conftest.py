"""Fixtures every test module may use, by name (pytest finds them here)."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator
from importlib import import_module
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, settings

from base.actor import Actor, acting_as
from tests.support import db_roles
from tests.support.restart import port_block

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


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, created and migrated by the owner (``DATABASE_URL``'s user); then, on
    PostgreSQL, every connection logs in as the application's role, which owns nothing (tests/support/db_roles.py),
    and the flush after a transactional test runs as the owner on its own connection."""
    if connection.vendor != "postgresql":
        yield
        return
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.execute_sql_flush
    with django_db_blocker.unblock():
        db_roles.switch_to_the_app_role()
    DatabaseOperations.execute_sql_flush = db_roles.flush_as_the_owner  # type: ignore[method-assign]
    yield
    DatabaseOperations.execute_sql_flush = original  # type: ignore[method-assign]
    with django_db_blocker.unblock():
        db_roles.switch_back_to_the_owner()


@pytest.fixture(autouse=True)
def _no_answers_kept_from_another_test() -> Iterator[None]:
    """What versions/cache.py keeps lives in this process across tests, whose databases are emptied
    (and the version counters with them) between them: each test starts with none kept."""
    from django.core.cache import caches

    caches["answers"].clear()
    yield


@pytest.fixture(autouse=True)
def _no_name_looked_up_off_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' traffic stays on this host, and a DNS query would leave it: an agent URL's host is
    resolved on every save and call (catalog/agent_address.py), and the schema fuzzer writes any
    name there. So only addresses and localhost are looked up; a test that needs a name to resolve
    replaces ``socket.getaddrinfo`` itself (tests/catalog/test_agent_networks.py)."""
    real = socket.getaddrinfo

    def local_only(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name is None or str(name).lower() in ("localhost", "localhost.", "ip6-localhost"):
            return real(host, *args, **kwargs)
        try:
            ipaddress.ip_address(str(name).split("%")[0])
        except ValueError:
            raise socket.gaierror(
                socket.EAI_NONAME, f"{name}: the tests look up no name off this host"
            ) from None
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", local_only)


@pytest.fixture
def app_role(db: None) -> str | None:
    """The role the test's connection logged in as, checked to be the application's kind: not a superuser,
    not the audit table's owner nor a member of it, and refused every change to the log. None on SQLite,
    which has no roles."""
    if connection.vendor != "postgresql":
        return None
    assert db_roles.login is not None
    db_roles.assert_the_log_is_append_only_for_this_login()
    return db_roles.login.role


@pytest.fixture
def owner_cursor() -> Any:
    """``with owner_cursor() as c:`` SQL the application's role rightly may not run (altering the log, say),
    as the tables' owner, on its own connection, committed when the block ends. It sees only what is
    committed, so a test changing rows it wrote is a transactional one. On SQLite (no roles), the test's
    own connection."""
    if connection.vendor != "postgresql":

        @contextlib.contextmanager
        def same_connection() -> Iterator[Any]:
            with connection.cursor() as cursor:
                yield cursor

        return same_connection
    return db_roles.owner_transaction


@pytest.fixture
def as_owner(transactional_db: None) -> Any:
    """``with as_owner():`` the test's own connection logs in as the owner for the block (migrating, or
    judging the owner as ``check --deploy`` would); nothing on SQLite."""
    return db_roles.as_owner


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
    from audit.models import AuditEntry

    guards = import_module("audit.migrations.0006_auditentry_table_of_its_own")
    log = AuditEntry._meta.db_table
    with connection.cursor() as cursor:
        for sql in guards.sqlite_drop_guards():
            cursor.execute(sql)
        cursor.execute(f"DELETE FROM {log}")
        for sql in guards.sqlite_guards(log):
            cursor.execute(sql)
