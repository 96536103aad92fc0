"""How long an audited write holds the chain's lock, which every audited write waits for: from
taking it to its commit, an entry runs one read (the last hash, sent with the lock in one message)
and one insert, and several entries written together (``audit_records``, a batch of placements)
the same two. At 16 steps side by side the writes queued there (docs/benchmarks.md, "Issue 25,
item 4: placements made together"). That the chain stays one chain under concurrent writers is
``test_audit_tamper.py``'s twenty writers."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEntry
from audit.services import audit_record, audit_records, verify_chain

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]  # SQLite takes no lock: one writer at a time


def test_an_entry_takes_the_chains_lock_and_reads_its_end_in_one_round_trip(actor):
    with transaction.atomic():
        audit_record(action="update", object_type="node", object_key="n0")
        with CaptureQueriesContext(connection) as seen:
            audit_record(action="update", object_type="node", object_key="n1")
    sql = [q["sql"] for q in seen.captured_queries]
    # The lock and the last hash, then the entry (three before: the lock alone first).
    assert len(sql) == 2, "\n".join(sql)
    assert "pg_advisory_xact_lock" in sql[0] and "ORDER BY" in sql[0] and sql[1].startswith("INSERT")
    assert verify_chain() == []


def test_entries_written_together_are_one_read_and_one_insert_each_chained_to_the_one_before(actor):
    with transaction.atomic(), CaptureQueriesContext(connection) as seen:
        audit_records([dict(action="start", object_type="replica", object_key=f"r{i}") for i in range(3)])
    assert len(seen.captured_queries) == 2
    entries = list(AuditEntry.objects.order_by("id"))
    assert [e.object_key for e in entries] == ["r0", "r1", "r2"]
    assert [e.prev_hash for e in entries[1:]] == [e.hash for e in entries[:-1]]
    assert len({e.txid for e in entries}) == 1
    assert verify_chain() == []
