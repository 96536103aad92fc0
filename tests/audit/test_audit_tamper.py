"""Tamper evidence that holds against database access, tried as an attacker would.

As the application's role (which owns nothing, README "The database's two
roles"; on PostgreSQL the whole suite logs in as it, tests/support/db_roles.py) the
database refuses every change to the log. As a superuser with the triggers
off (the owner, on a connection of its own), anything can be changed: then ``audit_verify``, with the
key the database never holds and the latest signed checkpoint, names the
first entry that does not match.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, connections, transaction
from rest_framework.test import APIClient

from audit.chain import Checkpoint, checkpoint_append, checkpoint_now, latest_checkpoint
from audit.models import AuditEntry
from audit.services import audit_record, verify_chain
from base.actor import Actor, acting_as
from catalog.models import GPUClass
from catalog.services import catalog as services
from tests.support import builders as b

pytestmark = pytest.mark.django_db

LOG = AuditEntry._meta.db_table


def entries(n: int = 24) -> list[AuditEntry]:
    with transaction.atomic():
        for i in range(n):
            audit_record(action="update", object_type="node", object_key=f"gpu-{i}", message=f"change {i}")
    return list(AuditEntry.objects.order_by("id"))


def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "checkpoints.jsonl"
    checkpoint_append(path, checkpoint_now())
    return path


@pytest.fixture
def superuser_sql(owner_cursor):
    """As the tables' owner, a superuser, on a connection of its own as an attacker's would be: the triggers
    off for the statements, on again after (the application's role may not: see the first test)."""

    def run(*statements: str) -> None:
        with owner_cursor() as c:
            c.execute(f"ALTER TABLE {LOG} DISABLE TRIGGER USER")
            for sql in statements:
                c.execute(sql)
            c.execute(f"ALTER TABLE {LOG} ENABLE TRIGGER USER")

    return run


def verify_fails(path: Path, *options: str) -> str:
    with pytest.raises(CommandError) as err:
        call_command(
            "audit_verify", "--checkpoint", str(path), *options, stdout=StringIO(), stderr=StringIO()
        )
    assert err.value.returncode == 1
    return str(err.value)


def first_bad(path: Path, *options: str) -> int:
    text = verify_fails(path, *options)
    return int(text.split("the first entry that does not match is #")[1].split(".")[0])


def plain_rehash_from(start: AuditEntry, *, message: str) -> list[str]:
    """The SQL an attacker without the key would write: the entry's content changed and every hash from it
    on recomputed as plain SHA-256 (the hash before keyed ones), so each still chains to the one before."""
    statements, prev = [], start.prev_hash
    for entry in AuditEntry.objects.filter(id__gte=start.pk).order_by("id"):
        if entry.pk == start.pk:
            entry.message = message
        entry.prev_hash = prev
        entry.hash = hashlib.sha256(entry.canonical()).hexdigest()
        statements.append(
            f"UPDATE {LOG} SET message = '{entry.message}', prev_hash = '{entry.prev_hash}', "
            f"hash = '{entry.hash}' WHERE id = {entry.pk}"
        )
        prev = entry.hash
    return statements


@pytest.mark.postgres
def test_the_suites_connections_log_in_as_the_application_role_the_tests_threads_and_processes_alike(
    tmp_path,
):
    """Not ``SET ROLE`` on a superuser's connection, which the test's own SQL could reset: the suite logs in
    as the role (tests/support/db_roles.py), and so do the threads and the processes the tests start."""
    from django.conf import settings

    from tests.support import db_roles
    from tests.support.restart import REPO_ROOT, database_url

    role = db_roles.login.role
    assert settings.DATABASES["default"]["USER"] == connection.settings_dict["USER"] == role
    seen: list[str] = []

    def in_a_thread() -> None:
        with connection.cursor() as c:
            c.execute("SELECT session_user")
            seen.append(c.fetchone()[0])
        connection.close()

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(timeout=30)
    with connection.cursor() as c:
        c.execute("SELECT session_user")
        seen.append(c.fetchone()[0])
    process = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from django.db import connection\nwith connection.cursor() as c:\n"
            "    c.execute('SELECT session_user'); print(c.fetchone()[0])",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "DATABASE_URL": database_url()},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen.append(process.stdout.split()[-1])  # after the shell's own banner
    assert seen == [role, role, role]
    assert role != db_roles.login.owner


@pytest.mark.postgres
def test_as_the_application_role_changes_go_through_and_the_log_refuses_update_delete_truncate_and_disabling_triggers(
    app_role,
):
    root = b.user("root")
    root.is_superuser = True
    root.save()
    # The application works as that role: a change through the API is saved and audited.
    api = APIClient()
    api.force_authenticate(root)
    response = api.post(
        "/api/gpu-classes/",
        {"name": "l4-24g", "memory_mib": 23034, "usable_mib": 20000, "compute_capability": "8.9"},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert AuditEntry.objects.filter(object_key="l4-24g", via="api").count() == 1
    from tests.support.db_roles import assert_the_log_is_append_only_for_this_login

    assert_the_log_is_append_only_for_this_login()  # what app_role checked, now with an entry to change
    assert AuditEntry.objects.count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_even_the_owner_is_refused_update_delete_and_truncate_by_the_triggers(actor, owner_cursor):
    entries(2)
    for sql in (f"UPDATE {LOG} SET message = 'x'", f"DELETE FROM {LOG}"):
        with pytest.raises(DatabaseError, match="append-only"), owner_cursor() as c:
            c.execute(sql)
    with pytest.raises(DatabaseError, match="append-only: TRUNCATE refused"), owner_cursor() as c:
        c.execute(f"TRUNCATE {LOG}")
    assert AuditEntry.objects.count() == 2


@pytest.mark.postgres
def test_db_app_role_refuses_a_superuser_or_the_owner():
    with pytest.raises(CommandError, match="could disable the triggers"):
        call_command("db_app_role", "postgres", stdout=StringIO())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_check_deploy_is_quiet_for_the_application_role_and_warns_for_the_owner_a_superuser(as_owner):
    from audit.checks import audit_deploy

    assert "audit.W002" not in {m.id for m in audit_deploy()}  # the suite's role, which owns nothing
    with as_owner():  # the owner here is a superuser too
        (warning,) = (m for m in audit_deploy() if m.id == "audit.W002")
    assert "a superuser, who can switch the audit log's triggers off" in warning.msg


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_altered_entry_is_named_by_the_full_walk(actor, tmp_path, superuser_sql):
    log = entries()
    path = checkpoint(tmp_path)
    superuser_sql(f"UPDATE {LOG} SET message = 'nothing happened' WHERE id = {log[7].pk}")
    assert first_bad(path, "--full") == log[7].pk


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_deleted_entry_is_named_by_the_one_after_it(actor, tmp_path, superuser_sql):
    log = entries()
    path = checkpoint(tmp_path)
    superuser_sql(f"DELETE FROM {LOG} WHERE id = {log[5].pk}")
    assert first_bad(path, "--full") == log[6].pk
    # From the checkpoint alone: one entry fewer before its own, which it counted.
    text = verify_fails(path)
    assert f"#{log[-1].pk}: the checkpoint of" in text and "the log has 23" in text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_entries_swapped_are_named(actor, tmp_path, superuser_sql):
    log = entries()
    path = checkpoint(tmp_path)
    a, z = log[3].pk, log[9].pk
    superuser_sql(
        f"UPDATE {LOG} SET id = -1 WHERE id = {a}",
        f"UPDATE {LOG} SET id = {a} WHERE id = {z}",
        f"UPDATE {LOG} SET id = {z} WHERE id = -1",
    )
    assert first_bad(path, "--full") == a


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("removed", [1, 19])
def test_the_newest_entries_removed_are_named_by_the_checkpoint(actor, tmp_path, removed, superuser_sql):
    log = entries()
    path = checkpoint(tmp_path)
    superuser_sql(f"DELETE FROM {LOG} WHERE id >= {log[-removed].pk}")
    assert verify_chain() == []  # the chain alone checks: only the checkpoint shows the tail went
    for options in ((), ("--full",)):
        text = verify_fails(path, *options)
        assert f"the first entry that does not match is #{log[-removed].pk}" in text
        assert "its tail was removed" in text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_whole_log_emptied_is_detected(actor, tmp_path, superuser_sql):
    entries()
    path = checkpoint(tmp_path)
    superuser_sql(f"TRUNCATE {LOG}")
    assert "its tail was removed" in verify_fails(path)
    assert "its tail was removed" in verify_fails(path, "--full")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_rewrite_with_recomputed_plain_hashes_is_named(actor, tmp_path, superuser_sql):
    log = entries()
    path = checkpoint(tmp_path)
    superuser_sql(*plain_rehash_from(log[10], message="rewritten"))
    assert first_bad(path, "--full") == log[10].pk
    # From the checkpoint: the rewrite reached its entry, whose hash is no longer the one recorded.
    text = verify_fails(path)
    assert f"the first entry that does not match is #{log[-1].pk}" in text
    assert "its hash is not the one the checkpoint" in text and "--full names the first" in text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_whole_chain_rewritten_with_plain_hashes_is_named_against_the_checkpoint(
    actor, tmp_path, superuser_sql
):
    log = entries()
    path = checkpoint(tmp_path)
    superuser_sql(*plain_rehash_from(log[0], message="rewritten from the start"))
    assert first_bad(path, "--full") == log[0].pk
    assert first_bad(path) == log[-1].pk


def test_a_forged_entry_appended_is_named(actor, tmp_path):
    """No trigger needs lifting to append: INSERT is the application's right. Without the key, the
    forger can only chain it by the plain hash."""
    log = entries(5)
    forged = AuditEntry(
        at=log[-1].at,
        actor="root",
        via="cli",
        action="delete",
        object_type="node",
        object_key="gpu-0",
        object_repr="gpu-0",
        prev_hash=log[-1].hash,
    )
    forged.hash = hashlib.sha256(forged.canonical()).hexdigest()
    forged.save()
    (problem,) = verify_chain()
    assert problem.startswith(f"entry #{forged.pk}: a plain hash after keyed ones")


def test_an_edited_checkpoint_line_is_refused(actor, tmp_path):
    entries(3)
    path = checkpoint(tmp_path)
    path.write_text(path.read_text().replace('"count": 3', '"count": 2'))
    text = verify_fails(path)
    assert "line 1: its signature does not match" in text


def test_an_intact_log_checks_against_its_checkpoint(actor, tmp_path):
    entries(3)
    path = checkpoint(tmp_path)
    entries(2)  # written after the checkpoint: the log only has to end at or after it
    out = StringIO()
    call_command("audit_verify", "--checkpoint", str(path), stdout=out)
    assert "intact: 5 entries" in out.getvalue() and "3 entries up to" in out.getvalue()
    assert latest_checkpoint(path).count == 3


def test_the_checkpoint_command_appends_a_signed_line_to_a_file_or_prints_it_for_log_shipping(
    actor, tmp_path, capsys
):
    log = entries(3)
    # As from the command line: no output stream handed in (an option named "stdout" once replaced it).
    call_command("audit_checkpoint", "--stdout")
    line = capsys.readouterr().out.strip()
    body = json.loads(line)
    assert (body["count"], body["last_id"], body["last_hash"]) == (3, log[-1].pk, log[-1].hash)
    assert body["signature"] and "\n" not in line
    # The line shipped elsewhere checks the log as the file would, its signature included.
    shipped = tmp_path / "shipped.jsonl"
    shipped.write_text(line + "\n")
    assert latest_checkpoint(shipped).count == 3
    call_command("audit_verify", "--checkpoint", str(shipped), stdout=StringIO())
    shipped.write_text(line.replace('"count": 3', '"count": 2') + "\n")
    assert "its signature does not match" in verify_fails(shipped)
    path = tmp_path / "kept.jsonl"
    written = StringIO()
    call_command("audit_checkpoint", "--file", str(path), stdout=written)
    entries(2)
    call_command("audit_checkpoint", "--file", str(path), stdout=written)
    assert f"checkpoint written to {path}: 3 entries up to #{log[-1].pk}" in written.getvalue()
    assert len(path.read_text().splitlines()) == 2 and latest_checkpoint(path).count == 5


def test_audit_verify_help_says_what_it_can_and_cannot_detect():
    from audit.management.commands.audit_verify import Command

    text = " ".join(Command().create_parser("manage.py", "audit_verify").format_help().split())
    assert "DETECTS" in text and "CANNOT DETECT" in text and "after the latest checkpoint" in text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_writers_leave_one_valid_chain():
    errors: list[BaseException] = []
    start = threading.Barrier(20)

    def writer(n: int) -> None:
        try:
            start.wait()
            with acting_as(Actor(via="cli", name=f"writer-{n}")):
                for i in range(5):
                    with transaction.atomic():
                        audit_record(action="update", object_type="node", object_key=f"w{n}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert AuditEntry.objects.count() == 100
    assert verify_chain() == []
    hashes = list(AuditEntry.objects.order_by("id").values_list("prev_hash", "hash"))
    assert len({prev for prev, _ in hashes}) == 100  # no two entries claim the same predecessor


def test_a_change_as_the_application_is_verified_with_the_key_not_a_plain_hash(actor):
    services.gpu_class_save(
        instance=GPUClass(name="x", memory_mib=10, usable_mib=5, compute_capability="8.0")
    )
    entry = AuditEntry.objects.get()
    assert entry.hash != hashlib.sha256(entry.canonical()).hexdigest()
    assert verify_chain() == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_worker_keeps_the_checkpoint_schedule_and_audit_verify_checks_against_its_latest(
    tmp_path, settings, superuser_sql
):
    from agent_testing import wait_until

    from tests.support.restart import db_worker, port_block

    path = tmp_path / "checkpoints.jsonl"
    settings.LLMGW_AUDIT_CHECKPOINT_FILE = str(path)
    settings.LLMGW_AUDIT_CHECKPOINT_SECONDS = 1.0
    with acting_as(Actor(via="cli", name="pytest")):
        entries(3)
    # Nobody asks for the schedule: the worker starts it as it starts.
    env = {"LLMGW_AUDIT_CHECKPOINT_FILE": str(path), "LLMGW_AUDIT_CHECKPOINT_SECONDS": "1"}
    with db_worker(tmp_path, "w1", port_base=port_block(), extra_env=env):
        wait_until(
            lambda: path.exists() and len(path.read_text().splitlines()) >= 1,
            timeout=30,
            interval=0.2,
            what="the worker's first checkpoint",
        )
        with acting_as(Actor(via="cli", name="pytest")):
            entries(2)
        wait_until(
            lambda: getattr(latest_checkpoint(path), "count", 0) == 5 or None,
            timeout=30,
            interval=0.2,
            what="a checkpoint counting the entries written since",
        )
    out = StringIO()
    call_command("audit_verify", "--checkpoint", str(path), stdout=out)
    assert "intact: 5 entries" in out.getvalue()
    superuser_sql(f"DELETE FROM {LOG} WHERE id = (SELECT max(id) FROM {LOG})")
    assert "its tail was removed" in verify_fails(path)


# -- catalog rows changed behind the application's back -----------------------------------------------


@pytest.mark.postgres
def test_every_catalog_table_has_the_row_change_trigger(db):
    from django.apps import apps

    tables = sorted(m._meta.db_table for m in apps.get_app_config("catalog").get_models())
    with connection.cursor() as c:
        c.execute(
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE t.tgname = 'audit_row_change' AND NOT t.tgisinternal"
        )
        with_trigger = sorted(row[0] for row in c.fetchall())
    assert with_trigger == tables


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_a_catalog_row_changed_by_sql_is_listed_as_changed_outside_the_application(
    tmp_path, app_role, owner_cursor
):
    from audit.models import RowChange
    from audit.selectors import changed_outside

    with acting_as(Actor(via="cli", name="pytest")):
        cls = services.gpu_class_save(
            instance=GPUClass(name="h100-80g", memory_mib=81559, usable_mib=79000, compute_capability="9.0")
        )
        cls.usable_mib = 78000
        services.gpu_class_save(instance=cls)
    assert RowChange.objects.filter(table_name="catalog_gpuclass").count() == 2  # both seen, both audited
    assert not changed_outside().exists()
    path = checkpoint(tmp_path)
    call_command("audit_verify", "--checkpoint", str(path), stdout=StringIO())

    with connection.cursor() as c:  # as the next restart would read it: edited behind the log's back
        c.execute("UPDATE catalog_gpuclass SET usable_mib = 81000 WHERE name = 'h100-80g'")

    (change,) = changed_outside()
    assert (change.table_name, change.operation, change.row_key) == (
        "catalog_gpuclass",
        "UPDATE",
        str(cls.pk),
    )
    assert (change.before["usable_mib"], change.after["usable_mib"]) == (78000, 81000)
    assert (
        change.db_role == connection.settings_dict["USER"] == app_role
    )  # who logged in, not the trigger's owner
    err = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("audit_verify", "--checkpoint", str(path), stdout=StringIO(), stderr=err)
    assert failed.value.returncode == 1 and "made outside the application" in str(failed.value)
    assert f"catalog_gpuclass UPDATE row {cls.pk}" in err.getvalue()
    lead = b.user("lead", "audit.view_auditentry")
    from django.test import Client

    client = Client()
    client.force_login(lead)
    page = client.get("/audit/outside/").content.decode()
    assert "catalog_gpuclass" in page and "81000" in page
    # and the record itself is append-only: the application's role has no DELETE on it, and the owner is
    # refused by its trigger
    with (
        pytest.raises(DatabaseError, match="permission denied"),
        transaction.atomic(),
        connection.cursor() as c,
    ):
        c.execute("DELETE FROM audit_rowchange")
    with pytest.raises(DatabaseError, match="append-only"), owner_cursor() as c:
        c.execute("DELETE FROM audit_rowchange")


def test_entries_from_before_keyed_hashes_check_only_as_many_as_the_first_checkpoint_counted(actor, tmp_path):
    """A log begun before keyed hashes: its first entries carry plain SHA-256. They check only as counted by
    a signed checkpoint (migrate writes the first), never without one, and a later checkpoint counting more
    of them (one written after a rewrite) does not bless them: the file is refused."""
    from django.utils import timezone

    from audit.chain import GENESIS_HASH

    prev = GENESIS_HASH
    for i in range(3):
        old = AuditEntry(
            at=timezone.now(),
            actor="before",
            via="cli",
            action="update",
            object_type="node",
            object_key=f"old-{i}",
            object_repr=f"old-{i}",
            prev_hash=prev,
        )
        old.hash = hashlib.sha256(old.canonical()).hexdigest()
        old.save()
        prev = old.hash
    log = entries(2)
    # No checkpoint: nothing counts them, so nothing tells them from entries rewritten without the key.
    problems = verify_chain()
    assert [p.split(":")[0] for p in problems] == [f"entry #{e.pk}" for e in log[:3]]
    assert "no signed checkpoint counts entries from before keyed hashes" in problems[0]
    path = checkpoint(tmp_path)
    assert latest_checkpoint(path).plain == 3
    for options in ((), ("--full",)):
        out = StringIO()
        call_command("audit_verify", "--checkpoint", str(path), *options, stdout=out, stderr=StringIO())
        assert "intact: 5 entries" in out.getvalue()
    # A checkpoint counting more plain entries than the first did.
    lines = path.read_text().splitlines()
    body = json.loads(lines[0])
    forged = Checkpoint(body["at"], body["count"], body["last_id"], body["last_hash"], plain=4)
    checkpoint_append(path, forged)
    text = verify_fails(path)
    assert "line 2" in text and "counts 4 entries with a plain hash" in text and "line 1" in text
