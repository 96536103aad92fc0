"""The fleet's versions (versions/triggers.py): every table a cached answer reads raises its area's
counter in the transaction that writes it, through the services and behind them (raw SQL), and
only when that transaction commits; writers of two areas never deadlock on the counters."""

from __future__ import annotations

import threading

import pytest
from django.apps import apps
from django.db import connection, connections, transaction

from audit.models import AuditEntry
from base.actor import Actor, acting_as
from catalog.models import GPUClass
from catalog.services import catalog as services
from operations.models import RestartOperation, RestartStep
from tests.support import builders as b
from versions.cache import versions_of
from versions.triggers import SQLITE_OPS, TRIGGER, sqlite_trigger_name, tracked_tables


def test_the_tracked_tables_are_every_table_of_the_catalog_operations_and_telemetry():
    tables = tracked_tables(apps)
    for label, area in (("catalog", "models"), ("operations", "operations"), ("telemetry", "readings")):
        for model in apps.get_app_config(label).get_models():
            if model._meta.model_name not in ("replica", "shard", "gpuclass", "node", "card"):
                assert tables[model._meta.db_table] == area
    # A replica's state and the cards it holds change often: kept apart from the fleet's structure.
    assert tables["catalog_replica"] == "replicas" and tables["catalog_shard"] == "placement"
    # The hardware apart from what is served on it: a model's edit keeps what shows only the nodes.
    assert tables["catalog_node"] == tables["catalog_card"] == tables["catalog_gpuclass"] == "fleet"
    assert tables["catalog_model"] == tables["catalog_profile"] == tables["catalog_enginedefault"] == "models"
    assert tables["telemetry_cardreading"] == tables["telemetry_nodereading"] == "readings"
    assert "operations_restartstep" in tables  # the operations' tables under their app's names
    assert tables[AuditEntry._meta.db_table] == "audit"  # the log, for the history panels
    assert "audit_rowchange" not in tables  # written beside every catalog write, read by no kept answer


@pytest.mark.django_db
def test_every_tracked_table_has_the_version_trigger():
    # Generated from the models: a table added to one of these apps without its trigger migration fails.
    tables = tracked_tables(apps)
    with connection.cursor() as c:
        if connection.vendor == "postgresql":
            c.execute(
                "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE t.tgname = %s AND NOT t.tgisinternal",
                [TRIGGER],
            )
            assert sorted(row[0] for row in c.fetchall()) == sorted(tables)
        else:
            c.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
            present = {row[0] for row in c.fetchall()}
            missing = [
                sqlite_trigger_name(t, op)
                for t in tables
                for op in SQLITE_OPS
                if sqlite_trigger_name(t, op) not in present
            ]
            assert missing == []


def committed(sql: str, params: list | None = None) -> None:
    with transaction.atomic(), connection.cursor() as c:
        c.execute(sql, params or [])


@pytest.mark.django_db(transaction=True)
def test_a_write_through_a_service_raises_the_fleet_version_and_no_other(audit_flushable):
    before = versions_of()
    with acting_as(Actor(via="cli", name="pytest")):
        services.gpu_class_save(
            instance=GPUClass(name="h100-80g", memory_mib=81559, usable_mib=79000, compute_capability="9.0")
        )
    after = versions_of()
    assert after.get("fleet") != before.get("fleet")
    others = ("models", "placement", "replicas", "operations", "readings")
    assert [after.get(a) for a in others] == [before.get(a) for a in others]


@pytest.mark.django_db(transaction=True)
def test_structure_names_the_fleet_and_the_models_together(audit_flushable):
    """A kept answer keyed on ``structure`` is thrown away by a model's edit and by a node's; one
    keyed on ``fleet`` only by the node's, one keyed on ``models`` only by the model's."""
    from versions.cache import key_of

    b.node("gpu-1")
    b.llama_8b()

    def keys() -> dict[str, str]:
        return {a: key_of("answer", [a], []) for a in ("structure", "fleet", "models")}

    assert key_of("answer", ["structure"], []) == key_of("answer", ["models", "fleet"], [])
    before = keys()
    committed("UPDATE catalog_model SET source = source || '~'")
    after_model = keys()
    assert [after_model[a] != before[a] for a in ("structure", "fleet", "models")] == [True, False, True]
    committed("UPDATE catalog_node SET state = 'down'")
    after_node = keys()
    assert [after_node[a] != after_model[a] for a in ("structure", "fleet", "models")] == [True, True, False]


def test_an_area_nobody_raises_is_refused():
    from versions.cache import key_of

    with pytest.raises(ValueError, match="no such version area"):
        key_of("answer", ["catalog"], [])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("area", "sql"),
    [
        ("fleet", 'UPDATE catalog_card SET "index" = "index" + 100'),
        ("fleet", 'DELETE FROM catalog_card WHERE "index" = 7'),
        ("models", "UPDATE catalog_model SET source = source || '~'"),
        ("models", "UPDATE catalog_profile SET revision = revision + 1"),
        ("replicas", "UPDATE catalog_replica SET state = 'ready'"),
        ("placement", "DELETE FROM catalog_shard"),
        (
            "operations",
            "INSERT INTO operations_agentcontact (node_id, last_seen_at) SELECT id, CURRENT_TIMESTAMP FROM catalog_node",
        ),
        (
            "readings",
            "INSERT INTO telemetry_nodereading (node_id, asked_at, error, source) "
            "SELECT id, CURRENT_TIMESTAMP, '', '' FROM catalog_node",
        ),
    ],
)
def test_a_write_by_raw_sql_raises_its_area(audit_flushable, area, sql):
    node = b.node("gpu-1")
    b.replica(b.profile(b.llama_8b()), node, cards=[0])
    before = versions_of()
    committed(sql)
    after = versions_of()
    others = sorted({"fleet", "models", "placement", "replicas", "operations", "readings"} - {area})
    assert after.get(area) != before.get(area)
    assert [after.get(a) for a in others] == [before.get(a) for a in others]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("sql", "raised"),
    [
        # Who holds a card (a replica's name, profile, rendezvous port) is the placement's as much as
        # the shard's (``HOLDER``): answers that show holders and not states are kept under it alone.
        ("UPDATE catalog_replica SET state = 'loading'", ["replicas"]),
        ("UPDATE catalog_replica SET name = name || '-x'", ["placement", "replicas"]),
        ("UPDATE catalog_replica SET rendezvous_port = 29500", ["placement", "replicas"]),
        (
            "UPDATE catalog_replica SET profile_id = (SELECT id FROM catalog_profile WHERE name = 'other')",
            ["placement", "replicas"],
        ),
        # A model's or a profile's name, a profile's model, and their rows made or deleted raise the
        # names' (``NAMED``); nothing else of theirs does.
        ("UPDATE catalog_model SET source = source || '~'", ["models"]),
        ("UPDATE catalog_profile SET revision = revision + 1", ["models"]),
        ("UPDATE catalog_model SET name = name || '-x'", ["models", "names"]),
        ("UPDATE catalog_profile SET name = name || '-x'", ["models", "names"]),
        (
            "UPDATE catalog_profile SET model_id = (SELECT id FROM catalog_model WHERE name = 'mistral')",
            ["models", "names"],
        ),
        ("DELETE FROM catalog_profile WHERE name = 'spare'", ["models", "names"]),
    ],
)
def test_a_column_trigger_raises_its_area_and_the_tables_other_columns_do_not(audit_flushable, sql, raised):
    """The areas narrower than their tables (versions/triggers.py, ``HOLDER``, ``NAMED``)."""
    node = b.node("gpu-1")
    model = b.llama_8b()
    b.llama_8b("mistral")
    b.profile(model, "other")
    b.profile(model, "spare")
    b.replica(b.profile(model), node, cards=[0])
    before = versions_of()
    committed(sql)
    after = versions_of()
    areas = ("fleet", "models", "names", "placement", "replicas", "operations", "readings")
    assert [a for a in areas if after.get(a) != before.get(a)] == raised


@pytest.mark.django_db(transaction=True)
def test_a_model_made_raises_the_names(audit_flushable):
    before = versions_of().get("names")
    b.llama_8b("new")
    assert versions_of().get("names") != before


@pytest.mark.django_db(transaction=True)
def test_a_write_rolled_back_raises_nothing(audit_flushable):
    b.node("gpu-1")
    before = versions_of()
    with pytest.raises(RuntimeError), transaction.atomic():
        with connection.cursor() as c:
            c.execute("UPDATE catalog_node SET state = 'down'")
        raise RuntimeError("changed my mind")
    assert versions_of() == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_version_is_raised_when_the_writer_commits_not_before(audit_flushable, owner_cursor):
    """Another connection sees the old version while the write is uncommitted, the new one after,
    and the counter's row is not locked until the commit: a reader never waits on a writer."""
    b.node("gpu-1")
    before = versions_of().get("fleet")
    other = connections.create_connection("default")
    try:
        with transaction.atomic():
            with connection.cursor() as c:
                c.execute("UPDATE catalog_node SET state = 'cordoned'")
            # The owner's, for the lock: FOR UPDATE needs the UPDATE the application's role has not.
            with owner_cursor() as c:
                c.execute("SET LOCAL lock_timeout = '200ms'")
                c.execute("SELECT n FROM versions_version WHERE area = 'fleet' FOR UPDATE")  # not held
            with other.cursor() as c:
                c.execute("SELECT born || '.' || n FROM versions_version WHERE area = 'fleet'")
                assert c.fetchone()[0] == before
        with other.cursor() as c:
            c.execute("SELECT born || '.' || n FROM versions_version WHERE area = 'fleet'")
            assert c.fetchone()[0] != before
    finally:
        other.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_truncate_raises_its_area(audit_flushable, owner_cursor):
    before = versions_of().get("readings")
    with owner_cursor() as c:  # the application's role may not TRUNCATE; the owner, behind its back, may
        c.execute("TRUNCATE telemetry_cardsample")
    assert versions_of().get("readings") != before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_writers_of_two_areas_in_opposite_orders_both_commit(audit_flushable):
    """Counters raised at each write would deadlock here: each writer would hold one area's counter
    and wait for the other's. Raised at commit, in one order, both go through."""
    b.node("gpu-1")
    before = versions_of()
    halfway = threading.Barrier(2, timeout=10)
    failures: list[BaseException] = []

    def writer(first: str, second: str) -> None:
        try:
            with transaction.atomic(), connection.cursor() as c:
                c.execute("SET LOCAL lock_timeout = '5s'")
                c.execute(first)
                halfway.wait()
                c.execute(second)
        except BaseException as err:  # noqa: BLE001 - reported below
            failures.append(err)
        finally:
            connection.close()

    threads = [
        threading.Thread(
            target=writer,
            args=("UPDATE catalog_node SET state = state", f"DELETE FROM {RestartStep._meta.db_table}"),
        ),
        threading.Thread(
            target=writer,
            args=(
                f"DELETE FROM {RestartOperation._meta.db_table}",
                "UPDATE catalog_gpuclass SET usable_mib = usable_mib",
            ),
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
    after = versions_of()
    assert after.get("fleet") != before.get("fleet") and after.get("operations") != before.get("operations")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_the_application_role_raises_versions_by_writing_but_cannot_set_them(app_role):
    from django.db.utils import ProgrammingError

    b.node("gpu-1")  # written as the application's role: the triggers' functions run as their owner
    before = versions_of().get("fleet")
    committed("UPDATE catalog_node SET state = 'down'")
    assert versions_of().get("fleet") != before
    with pytest.raises(ProgrammingError, match="permission denied"):
        committed("UPDATE versions_version SET n = 0")


@pytest.mark.django_db(transaction=True)
def test_an_upsert_raises_its_area(audit_flushable):
    # The telemetry's readings are written with INSERT ... ON CONFLICT DO UPDATE: on SQLite that
    # clause overrides a trigger's own, and a counter written with INSERT OR IGNORE failed.
    from telemetry.models import CardReading

    b.node("gpu-1", cards=1)
    card = b.Card.objects.get()
    reading = {"at": "2026-01-01T00:00:00Z", "memory_used_mib": 1, "foreign_mib": 0}
    for used in (1, 2):
        before = versions_of().get("readings")
        CardReading.objects.bulk_create(
            [CardReading(card=card, **{**reading, "memory_used_mib": used})],
            update_conflicts=True,
            unique_fields=["card"],
            update_fields=["memory_used_mib"],
        )
        assert versions_of().get("readings") != before
    assert CardReading.objects.get().memory_used_mib == 2
