"""Fixtures every test module may use, by name (pytest finds them here)."""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import socket
from collections.abc import Iterator
from importlib import import_module
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, settings

from base.actor import Actor, acting_as
from tests.support import db_flush, db_roles
from tests.support.restart import port_block

# Hypothesis's timing checks (a 200 ms deadline per example, "input generation is slow") judge the
# machine, not the code: on a shared two-core CI box they fail tests whose properties hold. The
# properties and the example counts stay as they are; only the clock is taken out of the verdict.
settings.register_profile(
    "llmgw", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("llmgw")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database-tests-only",
        action="store_true",
        help="run only the tests that use the database (pytest-django's db, transactional_db or "
        "django_db): CI's second run, on SQLite, after the whole suite ran on PostgreSQL. The others "
        "cannot reach the database (pytest-django refuses them), so they would run the same code twice.",
    )


def uses_the_database(item: pytest.Item) -> bool:
    """Whether pytest-django lets ``item`` reach the database: a django_db mark, or a fixture that
    asks for it (db, transactional_db, live_server, ... all go through _django_db_helper)."""
    return item.get_closest_marker("django_db") is not None or "_django_db_helper" in getattr(
        item, "fixturenames", ()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    if config.getoption("database_tests_only"):
        kept = [item for item in items if uses_the_database(item)]
        config.hook.pytest_deselected(items=[item for item in items if not uses_the_database(item)])
        items[:] = kept
    if not settings.configured or connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(
        reason="needs PostgreSQL: row locks and concurrent connections; SQLite runs one writer at a time"
    )
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _audit_checkpoints_of_the_sessions_own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """LLMGW_AUDIT_CHECKPOINT_FILE under the session's temporary directory, never the worktree's var/ (whose
    checkpoints are of another database): ``migrate`` writes the first checkpoint there as the test database
    is made. Each test then has a file of its own (``_audit_checkpoint_of_the_tests_own``)."""
    from django.conf import settings as django_settings

    folder = tmp_path_factory.mktemp("audit-checkpoints")
    before = django_settings.LLMGW_AUDIT_CHECKPOINT_FILE
    django_settings.LLMGW_AUDIT_CHECKPOINT_FILE = str(folder / "session.jsonl")
    yield folder
    django_settings.LLMGW_AUDIT_CHECKPOINT_FILE = before


_test_number = itertools.count(1)


@pytest.fixture(autouse=True)
def _audit_checkpoint_of_the_tests_own(_audit_checkpoints_of_the_sessions_own: Any) -> Iterator[None]:
    """Each test starts with no checkpoint (a file not yet written, its own), in the settings and in the
    environment of the processes it starts: one test's checkpoint never judges another's log."""
    from django.conf import settings as django_settings

    path = str(_audit_checkpoints_of_the_sessions_own / f"test-{next(_test_number)}.jsonl")
    before = django_settings.LLMGW_AUDIT_CHECKPOINT_FILE, os.environ.get("LLMGW_AUDIT_CHECKPOINT_FILE")
    django_settings.LLMGW_AUDIT_CHECKPOINT_FILE = os.environ["LLMGW_AUDIT_CHECKPOINT_FILE"] = path
    yield
    django_settings.LLMGW_AUDIT_CHECKPOINT_FILE = before[0]
    if before[1] is None:
        os.environ.pop("LLMGW_AUDIT_CHECKPOINT_FILE", None)
    else:
        os.environ["LLMGW_AUDIT_CHECKPOINT_FILE"] = before[1]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, created and migrated by the owner (``DATABASE_URL``'s user); then, on
    PostgreSQL, every connection logs in as the application's role, which owns nothing
    (tests/support/db_roles.py), and the flush after a transactional test runs as the owner on its own
    connection. On both, that flush puts back what post_migrate wrote rather than emitting it again
    (tests/support/db_flush.py)."""
    with db_flush.cheap_flushes():
        yield from _logged_in_as_the_app_role(django_db_blocker)


def _logged_in_as_the_app_role(django_db_blocker: Any) -> Iterator[None]:
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


@pytest.fixture(scope="session", autouse=True)
def _static_files_found_when_asked() -> None:
    """Each test client loads the middleware anew, and whitenoise, serving from the finders when
    collectstatic has not run (settings.py), then indexed every static file, headers and all: 37 ms a
    client, most of a request's time in the access matrix. In its development mode (autorefresh) it
    finds a file when one is asked for, the same file with the same headers; no test asks for one."""
    from django.conf import settings as django_settings

    django_settings.WHITENOISE_AUTOREFRESH = True


FAST_HASHER = "django.contrib.auth.hashers.MD5PasswordHasher"


@pytest.fixture(autouse=True)
def _passwords_hashed_fast(request: pytest.FixtureRequest) -> Iterator[None]:
    """Django's PBKDF2 takes a quarter second of CPU for each password it hashes or checks: for
    each user the suite makes with one (hundreds) and each sign-in try (the lockout tests make about
    90). A fast hasher comes first, which signs in the same way; the browser tests, which sign in as
    an operator does, keep the deployed one (``@pytest.mark.deployed_hasher``)."""
    from django.conf import settings as django_settings

    if request.node.get_closest_marker("deployed_hasher") or not django_settings.configured:
        yield
        return
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=[FAST_HASHER, *django_settings.PASSWORD_HASHERS]):
        yield


@pytest.fixture(autouse=True)
def _no_answers_kept_from_another_test() -> Iterator[None]:
    """What versions/cache.py keeps lives in this process across tests, whose databases are emptied
    (and the version counters with them) between them: each test starts with none kept."""
    from django.core.cache import caches

    from versions.cache import forget_kept_here

    caches["answers"].clear()
    forget_kept_here()
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
    settings.LLMGW_STOP_DRAIN_SECONDS = 0.5  # within the stale threshold, with the stop
    settings.LLMGW_AGENT_ABSENT_SECONDS = 2.0
    settings.LLMGW_RESTART_SETTLE_SECONDS = 0.2
    settings.LLMGW_RECONCILE_SECONDS = 1.0
    settings.LLMGW_RECONCILE_CLOCK_MARGIN_SECONDS = 0.0  # one host, one clock
    settings.LLMGW_RECONCILE_AGENT_TIMEOUT_SECONDS = 1.0
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
