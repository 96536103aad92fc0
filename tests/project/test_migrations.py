"""The move of the audit log and restarts to their own apps keeps every row (``make lint`` checks none is missing).

The move (catalog/0004, audit/0001, operations/0001) is undone and done again
on a database holding the demo fleet, its audit log, a restart with its
queued task and a viewer's permissions: what was there before is there after,
and the audit log's chain still verifies.
"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django_tasks_db.models import DBTaskResult

from audit.models import AuditEntry
from audit.services import verify_chain
from catalog.models import Replica
from operations.models import RestartOperation, RestartStep
from operations.services.start import restart_start

BEFORE_THE_MOVE = [("catalog", "0003_restart_operations"), ("audit", None), ("operations", None)]


@pytest.fixture
def migrate(as_owner, app_role):
    """Migrate as a deployment does: as the owner; back at the latest, ``db_app_role`` again, for the tables
    made anew (the row changes' among them, which the application's role may only read)."""

    def run(targets: list[tuple[str, str | None]] | None = None) -> None:
        with as_owner():
            executor = MigrationExecutor(connection)
            executor.migrate(targets or executor.loader.graph.leaf_nodes())
            executor.loader.build_graph()
            if app_role and not targets:
                call_command("db_app_role", app_role, stdout=io.StringIO())

    return run


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_the_move_to_the_audit_and_operations_apps_keeps_the_rows_and_the_chain(actor, migrate):
    call_command("seed_demo", "--users", stdout=io.StringIO())
    replica = Replica.objects.filter(state__in=Replica.LIVE_STATES).order_by("name").first()
    operation = restart_start(model_name=replica.profile.model.name, replicas=[replica.name], actor=actor)
    entries = list(AuditEntry.objects.order_by("id").values_list("id", "hash"))
    assert entries and verify_chain() == []
    lead = User.objects.get(username="lead")
    assert lead.has_perm("audit.view_auditentry") and lead.has_perm("operations.view_restartoperation")

    migrate(BEFORE_THE_MOVE)
    # As the code before the move left things: its content types and its task paths.
    assert ContentType.objects.filter(app_label="catalog", model="auditentry").exists()
    assert ContentType.objects.filter(app_label="catalog", model="restartoperation").exists()
    DBTaskResult.objects.filter(task_path="operations.tasks.run_restart").update(
        task_path="catalog.tasks.run_restart"
    )

    migrate()

    assert list(AuditEntry.objects.order_by("id").values_list("id", "hash")) == entries
    assert verify_chain() == []
    out = io.StringIO()
    call_command("audit_verify", stdout=out)
    assert f"intact: {len(entries)} entries" in out.getvalue()
    assert RestartOperation.objects.get(pk=operation.pk).state == RestartOperation.State.QUEUED
    assert RestartStep.objects.filter(operation_id=operation.pk, old_replica=replica).count() == 1
    assert DBTaskResult.objects.filter(task_path="operations.tasks.run_restart").exists()
    assert not DBTaskResult.objects.filter(task_path__startswith="catalog.").exists()
    lead = User.objects.get(username="lead")  # a fresh object: permissions are cached per instance
    assert lead.has_perm("audit.view_auditentry") and lead.has_perm("operations.view_restartoperation")
    assert not Permission.objects.filter(
        content_type__app_label="catalog", codename="view_auditentry"
    ).exists()
