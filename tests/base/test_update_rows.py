"""``update_rows`` writes what ``bulk_update`` writes, at a fraction of its CPU: each row its own
values of the fields named (JSON, times, keys, numbers, text, nulls), nothing else of them and no
other row; on PostgreSQL in one statement, and an over-long text refused as a save refuses it,
nothing written, rather than cut."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import DataError, connection, transaction
from django.test.utils import CaptureQueriesContext

from base.db import update_rows
from catalog.models import Replica
from tests.support import builders as b

pytestmark = pytest.mark.django_db


def _three():
    gpu = b.node("gpu-1", cards=4)
    llama = b.profile(b.llama_8b("llama"), "h100")
    other = b.profile(b.llama_8b("other"), "h100")
    rows = [b.replica(llama, gpu, [i], name=f"llama-{i}", port=8000 + i) for i in range(3)]
    return rows, other


def test_each_row_gets_its_own_values_of_the_fields_named_and_nothing_else():
    rows, other = _three()
    first, second, untouched = rows
    when = datetime(2026, 12, 6, 15, 30, 1, 250000, tzinfo=UTC)
    first.state, first.reason, first.measured_at = "stopping", "it's 'quoted'; -- and \\ kept", when
    first.planned_memory = {"weights_mib": 15_317, "cards": [0, 1], "note": None}
    first.port, first.profile = 9001, other
    second.state, second.reason, second.measured_at, second.planned_memory = "failed", "", None, {}
    second.port = 9002
    first.revision = second.revision = 99  # changed in memory, not named: not written
    fields = ["state", "reason", "measured_at", "planned_memory", "port", "profile"]

    with CaptureQueriesContext(connection) as seen:
        update_rows(Replica, [first, second], fields)

    if connection.vendor == "postgresql":
        assert len(seen.captured_queries) == 1, [q["sql"] for q in seen.captured_queries]
    got = {r.name: r for r in Replica.objects.filter(pk__in=[r.pk for r in rows])}
    a, b_, c = got["llama-0"], got["llama-1"], got["llama-2"]
    assert (a.state, a.reason, a.measured_at, a.port, a.profile_id) == (
        "stopping",
        "it's 'quoted'; -- and \\ kept",
        when,
        9001,
        other.pk,
    )
    assert a.planned_memory == {"weights_mib": 15_317, "cards": [0, 1], "note": None}
    assert (b_.state, b_.reason, b_.measured_at, b_.planned_memory, b_.port) == ("failed", "", None, {}, 9002)
    assert a.revision == b_.revision == untouched.revision  # not named, not written
    assert (c.state, c.port, c.reason) == ("ready", 8002, untouched.reason)


def test_nothing_to_write_runs_no_statement():
    rows, _ = _three()
    with CaptureQueriesContext(connection) as seen:
        update_rows(Replica, [], ["state"])
        update_rows(Replica, rows, [])
    assert seen.captured_queries == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite keeps any length of text")
def test_a_text_longer_than_its_column_is_refused_and_no_row_is_written():
    rows, _ = _three()
    first, second, _ = rows
    first.state, second.state = "stopping", "x" * 17  # state is varchar(16)
    with pytest.raises(DataError), transaction.atomic():
        update_rows(Replica, [first, second], ["state"])
    assert set(Replica.objects.values_list("state", flat=True)) == {"ready"}
