"""The audit log's and the restarts' tables take their apps' names (audit/0006, operations/0006) on a
database with data, and every guarantee that hung on the old names still holds after.

The database is taken back to just before the renames, where the code of then (the three models under
the tables the migrations' state gives them) grants the application's role its privileges, seeds the
demo fleet, starts a restart and appends to the audit log. Migrated forward (as the owner, with no
``db_app_role`` after): the rows and the chain are as they were and ``audit_verify`` passes; the log's
triggers refuse UPDATE, DELETE and TRUNCATE under their new names, and nothing is named after the old
tables; the version counters rise on writes to the renamed tables; on PostgreSQL the row changes are
still explained by the log, what the role was granted and refused under the old names holds under the
new ones, and ``check --deploy`` still finds the log's table.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.core.management.sql import emit_post_migrate_signal
from django.db import DatabaseError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.state import ProjectState

from audit.checks import app_role_problem
from audit.models import AuditEntry, RowChange
from audit.selectors import changed_outside
from audit.services import audit_record, verify_chain
from base.actor import Actor, acting_as
from catalog.models import GPUClass, Replica
from catalog.services import catalog as services
from operations.models import RestartOperation, RestartStep
from operations.services.start import restart_start
from tests.support import db_roles
from versions.cache import versions_of
from versions.triggers import SQLITE_OPS, TRIGGER, sqlite_trigger_name

BEFORE_THE_RENAMES = [("audit", "0005_row_changes"), ("operations", "0005_agent_contact")]
RENAMED = (AuditEntry, RestartOperation, RestartStep)


@pytest.fixture
def migrate(as_owner: Any, audit_flushable: None) -> Iterator[Any]:
    """Migrate as a deployment does, as the owner; and back at the latest whatever the test did (before
    ``audit_flushable`` empties the log at the end, which needs the latest guards)."""

    def run(targets: list[tuple[str, str]] | None = None) -> ProjectState:
        """Returns the state at ``targets`` (what the migrations there say of the models)."""
        with as_owner():
            executor = MigrationExecutor(connection)
            latest = not targets
            targets = targets or executor.loader.graph.leaf_nodes()
            executor.migrate(targets)
            executor.loader.build_graph()
            if latest:
                # As `manage.py migrate` ends: post_migrate, whose handlers put the version triggers
                # back on any table SQLite made anew (versions.triggers.repair_sqlite).
                emit_post_migrate_signal(verbosity=0, interactive=False, db=connection.alias)
        return executor.loader.project_state(targets)

    yield run
    run()


@contextlib.contextmanager
def tables_as_of(state: ProjectState) -> Iterator[dict[str, str]]:
    """For the block, the renamed models read and write the tables ``state`` gives them: the code of then.
    Yields each model's label with its table there."""
    old = {model: state.apps.get_model(model._meta.label)._meta.db_table for model in RENAMED}
    new = {model: model._meta.db_table for model in RENAMED}
    # The code of then wrote only the columns of then: a field added since (a step's ranks,
    # operations/0008) is left out of what it reads and writes.
    then = {
        model: {f.column for f in state.apps.get_model(model._meta.label)._meta.concrete_fields}
        for model in RENAMED
    }

    def name(tables: dict[Any, str]) -> None:
        for model, table in tables.items():
            model._meta.db_table = table
            for field in model._meta.concrete_fields:
                field.__dict__.pop("cached_col", None)  # a column said with its table's name, kept

    def columns_of_then(on: bool) -> None:
        for model, columns in then.items():
            for attr in ("concrete_fields", "local_concrete_fields"):
                model._meta.__dict__.pop(attr, None)  # cached: worked out again from the fields
                if on:
                    kept = tuple(f for f in getattr(model._meta, attr) if f.column in columns)
                    model._meta.__dict__[attr] = kept

    try:
        name(old)
        columns_of_then(True)
        yield {model._meta.label: table for model, table in old.items()}
    finally:
        columns_of_then(False)
        name(new)


def triggers_on(table: str) -> set[str]:
    with connection.cursor() as c:
        if connection.vendor == "postgresql":
            c.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal", [table]
            )
        else:
            c.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s", [table])
        return {row[0] for row in c.fetchall()}


def named_after(names: list[str]) -> list[str]:
    """Every trigger or function whose name or body says one of ``names``."""
    found = []
    with connection.cursor() as c:
        for name in names:
            if connection.vendor == "postgresql":
                c.execute(
                    "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgname LIKE %s "
                    "UNION ALL SELECT proname FROM pg_proc WHERE proname LIKE %s OR prosrc LIKE %s",
                    [f"%{name}%"] * 3,
                )
            else:
                c.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'trigger' AND (name LIKE %s OR sql LIKE %s)",
                    [f"%{name}%"] * 2,
                )
            found += [row[0] for row in c.fetchall()]
    return found


def log_guards(table: str, prefix: str) -> set[str]:
    """The append-only guards on the log, and its version triggers: ``prefix`` is the guards' names'."""
    if connection.vendor == "postgresql":
        return {f"{prefix}_no_update", f"{prefix}_no_truncate", f"{prefix}_txid", TRIGGER}
    return {f"{prefix}_no_update", f"{prefix}_no_delete"} | {
        sqlite_trigger_name(table, op) for op in SQLITE_OPS
    }


def committed(sql: str, params: list | None = None) -> None:
    with transaction.atomic(), connection.cursor() as c:
        c.execute(sql, params or [])


def refused(sql: str, why: str, cursor: Any) -> None:
    with pytest.raises(DatabaseError, match=why), transaction.atomic(), cursor() as c:
        c.execute(sql)


def seed_under_the_old_names(state: ProjectState, app_role: str | None, as_owner: Any) -> RestartOperation:
    """As the code before the renames: the role granted, the demo fleet, a restart and more entries."""
    assert all(state.apps.get_model(m._meta.label)._meta.db_table != m._meta.db_table for m in RENAMED)
    with tables_as_of(state) as old:
        assert triggers_on(old["audit.AuditEntry"]) == log_guards(old["audit.AuditEntry"], "catalog_audit")
        if app_role:
            with as_owner():  # the role's privileges on the old tables taken away, then granted as then
                with connection.cursor() as c:
                    c.execute(
                        f"REVOKE ALL ON {', '.join(old.values())} FROM {connection.ops.quote_name(app_role)}"
                    )
                out = io.StringIO()
                call_command("db_app_role", app_role, stdout=out)
                assert f"only read and append to {old['audit.AuditEntry']}" in out.getvalue()
        call_command("seed_demo", "--users", stdout=io.StringIO())
        with acting_as(Actor(via="cli", name="pytest")):
            replica = Replica.objects.filter(state__in=Replica.LIVE_STATES).order_by("name")[0]
            operation = restart_start(model_name=replica.profile.model.name, replicas=[replica.name])
            with transaction.atomic():
                for i in range(5):
                    audit_record(
                        action="update", object_type="node", object_key=f"gpu-{i}", message=f"old {i}"
                    )
        assert RestartStep.objects.filter(operation=operation).count() == 1
        assert verify_chain() == []
    return operation


@pytest.mark.django_db(transaction=True)
def test_the_renamed_tables_keep_their_rows_chain_guards_versions_row_changes_and_grants(
    migrate, app_role, as_owner, owner_cursor
):
    state = migrate(BEFORE_THE_RENAMES)
    old = [state.apps.get_model(m._meta.label)._meta.db_table for m in RENAMED]
    operation = seed_under_the_old_names(state, app_role, as_owner)
    with tables_as_of(state):
        entries = list(AuditEntry.objects.order_by("id").values_list("id", "hash"))
        steps = list(RestartStep.objects.order_by("id").values_list("id", "operation_id", "old_replica_id"))

    migrate()

    # The rows, under the new names only; the chain intact, and nothing changed outside the log.
    tables = set(connection.introspection.table_names())
    assert {m._meta.db_table for m in RENAMED} <= tables and not set(old) & tables
    assert list(AuditEntry.objects.order_by("id").values_list("id", "hash")) == entries
    assert (
        list(RestartStep.objects.order_by("id").values_list("id", "operation_id", "old_replica_id")) == steps
    )
    assert RestartOperation.objects.get(pk=operation.pk).state == RestartOperation.State.QUEUED
    assert verify_chain() == []
    out = io.StringIO()
    call_command("audit_verify", stdout=out)
    assert f"intact: {len(entries)} entries" in out.getvalue()

    # The log's guards, under their new names; no trigger or function says an old table or old guard.
    log = AuditEntry._meta.db_table
    assert triggers_on(log) == log_guards(log, "audit_entry")
    assert named_after([*old, "catalog_audit"]) == []
    refused(f"UPDATE {log} SET message = 'x'", "append-only: UPDATE refused", owner_cursor)
    refused(f"DELETE FROM {log}", "append-only: DELETE refused", owner_cursor)
    if connection.vendor == "postgresql":
        refused(f"TRUNCATE {log}", "append-only: TRUNCATE refused", owner_cursor)
        # The row changes' guard, bound to the renamed function.
        refused("DELETE FROM audit_rowchange", "append-only: DELETE refused", owner_cursor)
    assert list(AuditEntry.objects.order_by("id").values_list("id", "hash")) == entries

    # The version counters rise on writes to each renamed table.
    for model in (RestartOperation, RestartStep):
        before = versions_of().get("operations")
        committed(f"UPDATE {model._meta.db_table} SET reason = 'renamed'")
        assert versions_of().get("operations") != before, model
    before = versions_of().get("audit")
    with acting_as(Actor(via="cli", name="pytest")), transaction.atomic():
        audit_record(action="update", object_type="node", object_key="gpu-9", message="new")
    assert versions_of().get("audit") != before

    if connection.vendor != "postgresql":
        return  # SQLite has no roles, and records no row changes (check --deploy says so)

    # What the role was granted and refused under the old names holds under the new ones (it appended
    # and wrote the restarts above): still no change to the log, nor any way to lift its triggers.
    db_roles.assert_the_log_is_append_only_for_this_login()
    assert app_role_problem() is None
    with as_owner():
        assert "a superuser" in (app_role_problem() or "")  # it found the renamed table, and judged it

    # The row changes: each entry stamped with its transaction, a change through a service explained by
    # its entry, one by SQL behind the log's back named.
    assert AuditEntry.objects.latest("id").txid is not None
    with acting_as(Actor(via="cli", name="pytest")):
        services.gpu_class_save(
            instance=GPUClass(name="renamed", memory_mib=10, usable_mib=5, compute_capability="8.0")
        )
    change = RowChange.objects.filter(table_name=GPUClass._meta.db_table).latest("id")
    assert change.txid == AuditEntry.objects.latest("id").txid and not changed_outside().exists()
    committed(f"UPDATE {GPUClass._meta.db_table} SET usable_mib = 6 WHERE name = 'renamed'")
    assert [c.table_name for c in changed_outside()] == [GPUClass._meta.db_table]
    with pytest.raises(CommandError, match="made outside the application"):
        call_command("audit_verify", stdout=io.StringIO(), stderr=io.StringIO())
