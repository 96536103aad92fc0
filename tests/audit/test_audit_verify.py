"""``audit_verify`` needs the key, checkpoint or not, and reads a long log from its latest checkpoint.

Issue 24: a database superuser who rewrites entries (an actor changed to ``mallory``) and recomputes
every hash as plain SHA-256 is caught with a checkpoint file and without one, and by a checkpoint
written after the rewrite too; a missing checkpoint is said; ``migrate`` writes the first (the
secrets' keyed fingerprints: tests/audit/test_audit.py). Issue 25: the default walk reads only the entries after
the latest checkpoint, ``--full`` reads every one (with its progress) and finds what the default
walk cannot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from importlib import import_module
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.models.signals import post_init

from audit.chain import checkpoint_append, checkpoint_now
from audit.models import AuditEntry
from audit.services import audit_record, verify_chain

LOG = AuditEntry._meta.db_table

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("audit_flushable")]


def entries(n: int) -> list[AuditEntry]:
    with transaction.atomic():
        for i in range(n):
            audit_record(action="update", object_type="node", object_key=f"gpu-{i}", message=f"change {i}")
    return list(AuditEntry.objects.order_by("id"))


def checkpoint(path: Path) -> Path:
    checkpoint_append(path, checkpoint_now())
    return path


@pytest.fixture
def rewrite(owner_cursor) -> Callable[..., None]:
    """SQL as a database superuser runs it: the log's triggers lifted for the statements (on PostgreSQL as the
    tables' owner on a connection of its own; on SQLite by dropping them), put back after."""
    guards = import_module("audit.migrations.0006_auditentry_table_of_its_own")

    def run(*statements: str) -> None:
        with owner_cursor() as c:
            if connection.vendor == "postgresql":
                c.execute(f"ALTER TABLE {LOG} DISABLE TRIGGER USER")
            else:
                for sql in guards.sqlite_drop_guards():
                    c.execute(sql)
            for sql in statements:
                c.execute(sql)
            if connection.vendor == "postgresql":
                c.execute(f"ALTER TABLE {LOG} ENABLE TRIGGER USER")
            else:
                for sql in guards.sqlite_guards(LOG):
                    c.execute(sql)

    return run


def as_mallory_with_plain_hashes() -> list[str]:
    """Every entry's actor changed to mallory, and every hash recomputed as plain SHA-256, each chained to
    the one before: what a superuser without the key can do."""
    statements, prev = [], "0" * 64
    for entry in AuditEntry.objects.order_by("id"):
        entry.actor, entry.prev_hash = "mallory", prev
        entry.hash = hashlib.sha256(entry.canonical()).hexdigest()
        statements.append(
            f"UPDATE {LOG} SET actor = 'mallory', prev_hash = '{entry.prev_hash}', hash = '{entry.hash}' "
            f"WHERE id = {entry.pk}"
        )
        prev = entry.hash
    return statements


def verify(path: Path, *options: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("audit_verify", "--checkpoint", str(path), *options, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def verify_fails(path: Path, *options: str) -> str:
    with pytest.raises(CommandError) as failed:
        verify(path, *options)
    assert failed.value.returncode == 1
    return str(failed.value)


# -- issue 24: a chain that needs the key ----------------------------------------------------------------


def test_a_rewrite_as_mallory_with_recomputed_plain_hashes_fails_without_a_checkpoint(
    actor, tmp_path, rewrite
):
    log = entries(6)
    rewrite(*as_mallory_with_plain_hashes())
    assert set(AuditEntry.objects.values_list("actor", flat=True)) == {"mallory"}
    path = tmp_path / "none.jsonl"  # no checkpoint file at all
    for options in ((), ("--full",)):
        text = verify_fails(path, *options)
        assert f"the first entry that does not match is #{log[0].pk}" in text
        assert "a plain SHA-256 hash, which anyone with the database can recompute" in text
    assert len(verify_chain()) == 6  # each one named


def test_a_rewrite_as_mallory_with_recomputed_plain_hashes_fails_against_a_checkpoint(
    actor, tmp_path, rewrite
):
    log = entries(6)
    path = checkpoint(tmp_path / "checkpoints.jsonl")
    rewrite(*as_mallory_with_plain_hashes())
    assert f"is #{log[-1].pk}" in verify_fails(path)  # its own entry's hash is not the one it recorded
    text = verify_fails(path, "--full")
    assert f"the first entry that does not match is #{log[0].pk}" in text
    # The worker's next checkpoint, taken of the rewritten log, does not bless it: it counts 6 plain-hash
    # entries where the first counted none.
    checkpoint(path)
    assert "counts 6 entries with a plain hash" in verify_fails(path)


def test_with_no_checkpoint_audit_verify_reads_every_entry_and_says_nothing_anchors_the_end(actor, tmp_path):
    entries(3)
    out, err = verify(tmp_path / "none.jsonl")
    assert f"no signed checkpoint in {tmp_path / 'none.jsonl'}" in err
    assert "intact: 3 entries, every one read" in out
    assert "but no signed checkpoint" in out and "entries removed from its end would not show" in out


def test_migrate_writes_the_first_checkpoint_once(actor, settings, tmp_path, as_owner):
    log = entries(4)
    path = tmp_path / "var" / "checkpoints.jsonl"
    settings.LLMGW_AUDIT_CHECKPOINT_FILE = str(path)
    out = StringIO()
    with as_owner():
        call_command("migrate", verbosity=1, stdout=out)
    assert f"first checkpoint written to {path}: 4 entries up to #{log[-1].pk}" in out.getvalue()
    assert len(path.read_text().splitlines()) == 1
    entries(1)
    with as_owner():
        call_command("migrate", verbosity=1, stdout=StringIO())
    assert len(path.read_text().splitlines()) == 1  # it holds one already: nothing written
    stdout = StringIO()
    call_command("audit_verify", stdout=stdout, stderr=StringIO())
    assert (
        "intact: 5 entries" in stdout.getvalue() and f"(4 entries up to #{log[-1].pk})" in stdout.getvalue()
    )
    # A file it cannot write: the migrations stand, and it says what to do.
    (tmp_path / "a-file").write_text("")
    settings.LLMGW_AUDIT_CHECKPOINT_FILE = str(tmp_path / "a-file" / "checkpoints.jsonl")
    out = StringIO()
    with as_owner():
        call_command("migrate", verbosity=1, stdout=out)
    assert (
        "first checkpoint could not be written" in out.getvalue() and "run audit_checkpoint" in out.getvalue()
    )


# -- issue 25: a verifier for a log that keeps growing ---------------------------------------------------


@pytest.fixture
def entries_read() -> Iterator[list[int]]:
    """The ids of the audit entries read from the database (made into objects) while the test runs."""
    read: list[int] = []

    def seen(sender, instance, **kwargs) -> None:
        if instance.pk is not None:
            read.append(instance.pk)

    post_init.connect(seen, sender=AuditEntry)
    yield read
    post_init.disconnect(seen, sender=AuditEntry)


def test_the_default_walk_reads_only_the_checkpoints_entry_and_those_after_it(actor, tmp_path, entries_read):
    before = entries(40)
    path = checkpoint(tmp_path / "checkpoints.jsonl")
    after = entries(5)[40:]
    entries_read.clear()
    out, _ = verify(path)
    assert sorted(entries_read) == [before[-1].pk] + [e.pk for e in after]
    assert "intact: 45 entries" in out and "the 5 after it were read" in out
    entries_read.clear()
    out, _ = verify(path, "--full")
    assert len(entries_read) == 45 and "intact: 45 entries, every one read" in out


def test_the_full_walk_finds_an_entry_altered_before_the_checkpoint_which_the_default_walk_does_not_read(
    actor, tmp_path, rewrite
):
    log = entries(10)
    path = checkpoint(tmp_path / "checkpoints.jsonl")
    entries(2)
    rewrite(f"UPDATE {LOG} SET actor = 'mallory' WHERE id = {log[3].pk}")  # its hash left as it was
    out, _ = verify(path)  # what its help says: entries before the checkpoint are not read again
    assert "intact: 12 entries" in out and "--full reads every one" in out
    text = verify_fails(path, "--full")
    assert f"the first entry that does not match is #{log[3].pk}" in text
    assert "its content does not match its keyed hash" in text


def test_the_full_walk_says_how_far_it_is(actor, tmp_path, monkeypatch):
    import audit.verify

    monkeypatch.setattr(audit.verify, "PROGRESS_EVERY", 10)
    entries(25)
    _, err = verify(checkpoint(tmp_path / "checkpoints.jsonl"), "--full")
    lines = [line.split(" in ")[0] for line in err.splitlines() if line.startswith("read ")]
    assert lines == [
        "read 10 of 25 entries (40%)",
        "read 20 of 25 entries (80%)",
        "read 25 of 25 entries (100%)",
    ]
