"""Changes outside the application, recorded by the database as each transaction commits (issue 25).

``changed_outside()`` was an anti-join of every row change against the whole log (``NOT IN``: a subquery
scanned again per row change, minutes on a million entries). Now a trigger deferred to the commit records
each row change whose transaction wrote no audit entry, and ``/audit/outside/`` and ``audit_verify`` read
only those records: no query of theirs reads the log.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEntry, OutsideChange, RowChange
from audit.selectors import changed_outside, outside_page
from audit.services import audit_record
from base.actor import Actor, acting_as
from catalog.models import GPUClass
from catalog.services import catalog as services
from tests.support import builders as b

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("audit_flushable"),
]

LOG = AuditEntry._meta.db_table


def gpu_class(name: str) -> GPUClass:
    with acting_as(Actor(via="cli", name="pytest")):
        return services.gpu_class_save(
            instance=GPUClass(name=name, memory_mib=81559, usable_mib=79000, compute_capability="9.0")
        )


def test_a_change_is_outside_when_its_transaction_commits_without_an_entry_whatever_the_order_inside_it(
    app_role,
):
    gpu_class("audited")  # through the service: the row first, its entry after, one transaction
    with transaction.atomic(), connection.cursor() as c:  # the entry first, then the row by SQL
        with acting_as(Actor(via="cli", name="pytest")):
            audit_record(action="update", object_type="gpu_class", object_key="audited", message="said first")
        c.execute(f"UPDATE {GPUClass._meta.db_table} SET usable_mib = 78000 WHERE name = 'audited'")
    with pytest.raises(RuntimeError), transaction.atomic(), connection.cursor() as c:  # undone: nothing
        c.execute(f"UPDATE {GPUClass._meta.db_table} SET usable_mib = 1 WHERE name = 'audited'")
        raise RuntimeError("rolled back")
    assert not OutsideChange.objects.exists()
    with connection.cursor() as c:  # behind the log's back, committed
        c.execute(f"UPDATE {GPUClass._meta.db_table} SET usable_mib = 77000 WHERE name = 'audited'")
    (change,) = changed_outside()
    assert (change.operation, change.after["usable_mib"]) == ("UPDATE", 77000)
    assert list(OutsideChange.objects.values_list("change_id", flat=True)) == [change.pk]
    assert RowChange.objects.count() == 3  # the service's insert, the UPDATE after its entry, this one


def test_the_outside_page_and_audit_verify_read_the_recorded_changes_never_the_log(app_role, tmp_path):
    for i in range(3):
        gpu_class(f"audited-{i}")
    with connection.cursor() as c:
        for i in range(60):  # two pages of them
            c.execute(
                f"UPDATE {GPUClass._meta.db_table} SET usable_mib = {70000 + i} WHERE name = 'audited-0'"
            )
    lead = b.user("lead", "audit.view_auditentry")
    client = Client()
    client.force_login(lead)
    client.get("/audit/outside/")  # the session and the permissions read once
    with CaptureQueriesContext(connection) as page_queries:
        first = client.get("/audit/outside/")
    assert first.status_code == 200 and "70059" in first.content.decode()
    assert first.context["page"].older is not None and len(first.context["page"].entries) == 50
    older = client.get("/audit/outside/", {"before": first.context["page"].older})
    assert len(older.context["page"].entries) == 10 and "70000" in older.content.decode()
    with CaptureQueriesContext(connection) as verify_queries, pytest.raises(CommandError) as failed:
        call_command(
            "audit_verify", "--checkpoint", str(tmp_path / "c.jsonl"), stdout=StringIO(), stderr=StringIO()
        )
    assert "60 catalog row change(s) were made outside" in str(failed.value)
    outside_sql = [
        q["sql"]
        for q in verify_queries.captured_queries
        if "audit_rowchange" in q["sql"] or "outside" in q["sql"]
    ]
    for sql in [q["sql"] for q in page_queries.captured_queries] + outside_sql:
        assert not (LOG in sql and ("audit_rowchange" in sql or "outsidechange" in sql)), sql


def test_the_record_is_written_by_the_database_alone_and_never_changed(app_role, owner_cursor):
    gpu_class("x")
    with connection.cursor() as c:
        c.execute(f"UPDATE {GPUClass._meta.db_table} SET usable_mib = 1 WHERE name = 'x'")
    change = OutsideChange.objects.get()
    for sql in (
        f"INSERT INTO {OutsideChange._meta.db_table} (change_id) VALUES ({change.pk} + 1000)",
        f"DELETE FROM {OutsideChange._meta.db_table}",
    ):
        with (
            pytest.raises(DatabaseError, match="permission denied"),
            transaction.atomic(),
            connection.cursor() as c,
        ):
            c.execute(sql)
    with pytest.raises(DatabaseError, match="append-only"), owner_cursor() as c:
        c.execute(f"DELETE FROM {OutsideChange._meta.db_table}")
    assert OutsideChange.objects.count() == 1 and outside_page().entries == [
        RowChange.objects.get(pk=change.pk)
    ]
