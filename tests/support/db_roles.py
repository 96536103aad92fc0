"""On PostgreSQL the suite logs in as the application's role, as a deployment does (README, "The database's
two roles"): the owner (``DATABASE_URL``'s user) creates and migrates the test database, then grants a
LOGIN role that owns nothing (``manage.py db_app_role``), and every connection from then on logs in as
that role: the tests', their threads', the live server's, and the processes they start (their
``DATABASE_URL`` is made from the connection's settings, ``restart_support.database_url``).

What that role rightly cannot do runs as the owner, said so by name: over the owner's own connection
(``owner_transaction``, the ``owner_cursor`` fixture) pytest-django's flush and the tamper tests' "as a
superuser with the triggers off"; migrating by hand with the test's connection logged in as the owner
for the block (``as_owner``).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from io import StringIO
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connection, connections

# PostgreSQL cuts identifiers at 63 bytes.
_MAX_NAME = 63


@dataclass
class Login:
    """Who the suite's connections log in as: the application's role, and the owner kept aside."""

    owner: str
    owner_password: str
    role: str
    password: str
    owner_connection: Any = None  # the owner's own connection, opened when first needed


# Set while the suite runs as the application's role (PostgreSQL only).
login: Login | None = None


def app_role_name(database: str) -> str:
    """The application's role for one test database: its own name, so concurrent runs on other test
    databases of the same server (and a run that died) never meet it."""
    return f"{database[: _MAX_NAME - 4]}_app"


def _log_in_as(user: str, password: str) -> None:
    """Every connection, open or still to be made in any thread, logs in as ``user`` from now on."""
    for alias in connections:
        if connections.settings[alias]["ENGINE"] != "django.db.backends.postgresql":
            continue
        connections[alias].close()
        for settings_dict in (
            settings.DATABASES[alias],
            connections.settings[alias],
            connections[alias].settings_dict,
        ):
            settings_dict["USER"], settings_dict["PASSWORD"] = user, password


def switch_to_the_app_role() -> Login:
    """As the owner, after the test database is migrated: create the application's LOGIN role if it is
    missing (a run that died leaves it), grant it as the README says, and log every connection in as it."""
    global login
    s = connection.settings_dict
    name, password = app_role_name(s["NAME"]), secrets.token_hex(16)
    q = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name])
        verb = "ALTER" if cursor.fetchone() else "CREATE"
        # A password, so the switch works where the server asks for one; trust auth ignores it.
        cursor.execute(f"{verb} ROLE {q} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{password}'")
    call_command("db_app_role", name, stdout=StringIO())
    login = Login(owner=s["USER"], owner_password=s.get("PASSWORD") or "", role=name, password=password)
    _log_in_as(name, password)
    return login


def switch_back_to_the_owner() -> None:
    """At the session's end: the owner again (who drops the test database), and the role gone."""
    global login
    if login is None:
        return
    if login.owner_connection is not None:
        login.owner_connection.close()
    _log_in_as(login.owner, login.owner_password)
    q = connection.ops.quote_name(login.role)
    with connection.cursor() as cursor:
        # DROP OWNED BY takes back its grants and default privileges in this database; it owns nothing.
        cursor.execute(f"DROP OWNED BY {q}")
        cursor.execute(f"DROP ROLE {q}")
    connection.close()
    login = None


def owner_connection() -> Any:
    """The owner's own connection to the test database, beside the tests' (opened once, kept open)."""
    assert login is not None
    if login.owner_connection is None:
        tests = connections[DEFAULT_DB_ALIAS]
        settings_dict = {**tests.settings_dict, "USER": login.owner, "PASSWORD": login.owner_password}
        login.owner_connection = type(tests)(settings_dict, alias="owner")
    return login.owner_connection


@contextlib.contextmanager
def owner_transaction(*, triggers_off: bool = False) -> Iterator[Any]:
    """A cursor on the owner's own connection, in one transaction committed when the block ends, so the
    tests' connection sees the result. ``triggers_off``: every trigger lifted for this transaction alone
    (``session_replication_role``, which needs the owner to be a superuser, as ``DATABASE_URL``'s is
    here). The tests' connection must not hold locks on the tables touched, or this waits (at most 60 s)."""
    owner = owner_connection()
    owner.ensure_connection()
    with owner.connection.transaction(), owner.cursor() as cursor:  # Django's cursor: Django's errors
        cursor.execute("SET LOCAL lock_timeout = '60s'")
        if triggers_off:
            cursor.execute("SET LOCAL session_replication_role = replica")
        yield cursor


def flush_as_the_owner(self: Any, sql_list: Iterable[str]) -> None:
    """pytest-django empties the tables after a transactional test with one ``TRUNCATE``: the application's
    role may not (no TRUNCATE privilege), and the audit log's statement trigger refuses it even to the
    owner, as it must. So the owner runs the flush on its own connection, the triggers lifted for that
    transaction alone; never a test's own SQL.

    It ``DELETE``s the rows of the tables the ``TRUNCATE`` names rather than run it: the same empty
    tables (the sequences go on, as ``TRUNCATE`` without ``RESTART IDENTITY`` leaves them), in
    milliseconds instead of the second a ``TRUNCATE`` of every table takes to make them anew on disk
    (tests/support/db_flush.py)."""
    statements = list(sql_list)
    plain = all(sql.startswith("TRUNCATE ") and "RESTART IDENTITY" not in sql for sql in statements)
    tables = self.connection.introspection.django_table_names(only_existing=True, include_views=False)
    with owner_transaction(triggers_off=True) as cursor:
        if not plain:  # not the flush after a test: as asked
            for sql in statements:
                cursor.execute(sql)
            return
        for table in tables if statements else ():
            cursor.execute(f"DELETE FROM {self.quote_name(table)}")


@contextlib.contextmanager
def as_owner() -> Iterator[None]:
    """For the block, this thread's default connection logs in as the owner (who may migrate), then as
    the application's role again. Only between transactions: the test must be a transactional one."""
    if login is None:  # SQLite: no roles
        yield
        return
    assert not connection.in_atomic_block, "as_owner needs a transactional test (django_db(transaction=True))"
    app_settings = connection.settings_dict
    connection.close()
    connection.settings_dict = {**app_settings, "USER": login.owner, "PASSWORD": login.owner_password}
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict = app_settings


def refused_on_the_log() -> dict[str, str]:
    """As the application's role, each of these is refused before the audit log's triggers are even asked:
    the statement, and what the refusal says."""
    from audit.models import AuditEntry

    log = AuditEntry._meta.db_table
    return {
        f"UPDATE {log} SET message = 'x'": "permission denied",
        f"DELETE FROM {log}": "permission denied",
        f"TRUNCATE {log}": "permission denied",
        f"ALTER TABLE {log} DISABLE TRIGGER audit_entry_no_update": "must be owner",
        f"ALTER TABLE {log} DISABLE TRIGGER USER": "must be owner",
        f"DROP TRIGGER audit_entry_no_truncate ON {log}": "must be owner",
    }


def assert_the_log_is_append_only_for_this_login() -> None:
    """The test's connection logged in (not ``SET ROLE``) as the application's role, which is no superuser
    and does not own the audit table, and the database refuses it every change to the log."""
    from django.db import DatabaseError, transaction

    from audit.models import AuditEntry

    assert login is not None
    with connection.cursor() as cursor:
        cursor.execute("RESET ROLE")  # changes nothing: the session itself is the role's
        cursor.execute(
            "SELECT session_user, current_user, r.rolsuper, pg_has_role(current_user, t.tableowner, 'MEMBER') "
            "FROM pg_roles r, pg_tables t WHERE r.rolname = current_user AND t.tablename = %s "
            "AND t.schemaname = current_schema()",
            [AuditEntry._meta.db_table],
        )
        assert cursor.fetchone() == (login.role, login.role, False, False)
    for sql, why in refused_on_the_log().items():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql)
        except DatabaseError as refused:
            assert why in str(refused), (sql, str(refused))
        else:
            raise AssertionError(f"{sql!r} went through as {login.role}")
