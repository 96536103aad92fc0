"""The audit write path: one entry per change, in the change's transaction, chained."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models.deletion import ProtectedError

from audit.models import AuditEntry, AuditLogIsAppendOnly
from audit.services import GENESIS_HASH, audit_record, verify_chain
from base.actor import Actor, acting_as
from base.errors import DomainError
from catalog.models import GPUClass, Node, ServedModel
from catalog.services import catalog as services
from tests.support import builders as b

LOG = AuditEntry._meta.db_table

pytestmark = pytest.mark.django_db


def test_a_create_writes_one_entry_with_actor_via_and_after(actor):
    services.gpu_class_save(
        instance=GPUClass(name="l4-24g", memory_mib=23034, usable_mib=20000, compute_capability="8.9")
    )
    (entry,) = AuditEntry.objects.all()
    assert (entry.actor, entry.via, entry.action, entry.object_type, entry.object_key) == (
        "pytest",
        "cli",
        "create",
        "gpuclass",
        "l4-24g",
    )
    assert entry.before is None
    assert entry.after["usable_mib"] == 20000
    assert entry.request_id == actor.request_id
    assert entry.prev_hash == GENESIS_HASH


def test_an_update_records_before_and_after_and_what_changed(actor):
    cls = b.gpu_class("l4-24g", memory_mib=23034, usable_mib=20000, capability="8.9")
    cls.usable_mib = 21000
    services.gpu_class_save(instance=cls)
    (entry,) = AuditEntry.objects.all()
    assert entry.action == "update"
    assert (entry.before["usable_mib"], entry.after["usable_mib"]) == (20000, 21000)
    assert "usable_mib" in entry.message


def test_saving_without_a_change_writes_nothing(actor):
    cls = b.gpu_class()
    services.gpu_class_save(instance=cls)
    assert AuditEntry.objects.count() == 0


def test_a_refused_change_writes_no_entry_and_saves_nothing(actor):
    cls = b.gpu_class("l4-24g", memory_mib=23034, usable_mib=20000, capability="8.9")
    cls.usable_mib = 99999  # more than the card has
    with pytest.raises(DomainError) as err:
        services.gpu_class_save(instance=cls)
    assert err.value.code == "invalid"
    assert "usable" in err.value.message.lower()
    assert AuditEntry.objects.count() == 0
    assert GPUClass.objects.get(name="l4-24g").usable_mib == 20000


def test_an_entry_is_written_inside_the_change_and_rolls_back_with_it(actor):
    with pytest.raises(RuntimeError), transaction.atomic():
        services.gpu_class_save(
            instance=GPUClass(name="x", memory_mib=10, usable_mib=5, compute_capability="8.0")
        )
        raise RuntimeError("the caller's transaction fails later")
    assert not GPUClass.objects.filter(name="x").exists()
    assert AuditEntry.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_audit_record_refuses_to_run_outside_a_transaction(actor):
    with pytest.raises(RuntimeError, match="inside the transaction"):
        audit_record(action="x", object_type="y", object_key="z")


def test_no_actor_means_no_change():
    with pytest.raises(RuntimeError, match="no actor is set"):
        services.gpu_class_save(
            instance=GPUClass(name="x", memory_mib=10, usable_mib=5, compute_capability="8.0")
        )
    assert not GPUClass.objects.exists()


def test_node_tokens_are_never_written_to_the_log(actor):
    node = services.node_save(
        instance=Node(
            name="gpu-1", agent_url="http://127.0.0.1:9", agent_token="s3cret-agent-token-0123456789abcdef"
        )
    )
    node.agent_token = "n3w-s3cret-agent-token-0123456789abc"
    services.node_save(instance=node)
    entries = list(AuditEntry.objects.order_by("id"))
    assert len(entries) == 2  # the rotation is recorded...
    assert entries[1].message == "changed agent_token"
    assert entries[1].before["agent_token"] != entries[1].after["agent_token"]
    assert all("s3cret" not in str(e.before) + str(e.after) + e.message for e in entries)


def test_a_user_acting_through_a_request_is_recorded_with_a_copied_name(db):
    user = b.user("alice")
    with acting_as(Actor(via="ui", user=user, request_id="req-1")):
        services.model_save(instance=ServedModel(name="m", source="org/m"))
    entry = AuditEntry.objects.get()
    assert (entry.user, entry.actor, entry.via, entry.request_id) == (user, "alice", "ui", "req-1")
    with pytest.raises(ProtectedError):
        user.delete()  # accounts with a history are deactivated, not deleted


def test_entries_are_never_updated_or_deleted_through_the_orm(actor):
    services.gpu_class_save(
        instance=GPUClass(name="x", memory_mib=10, usable_mib=5, compute_capability="8.0")
    )
    entry = AuditEntry.objects.get()
    entry.message = "rewritten"
    with pytest.raises(AuditLogIsAppendOnly):
        entry.save()
    with pytest.raises(AuditLogIsAppendOnly):
        entry.delete()
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEntry.objects.all().delete()
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEntry.objects.update(message="x")


def test_the_database_refuses_to_change_or_remove_an_entry_even_by_raw_sql(actor):
    services.gpu_class_save(
        instance=GPUClass(name="x", memory_mib=10, usable_mib=5, compute_capability="8.0")
    )
    statements = [f"UPDATE {LOG} SET message = 'x'", f"DELETE FROM {LOG}"]
    if connection.vendor == "postgresql":
        statements.append(f"TRUNCATE {LOG}")  # a statement trigger: row triggers never see it
    # SQLite's triggers refuse; on PostgreSQL the application's role has not even the privilege (the
    # triggers behind it refuse the owner: test_audit_tamper.py).
    why = "permission denied" if connection.vendor == "postgresql" else "append-only"
    for sql in statements:
        with (
            pytest.raises(DatabaseError, match=why),
            transaction.atomic(),
            connection.cursor() as c,
        ):
            if connection.vendor == "postgresql":
                c.execute(
                    "SET CONSTRAINTS ALL IMMEDIATE"
                )  # else TRUNCATE is refused for the pending FK checks
            c.execute(sql)
    assert AuditEntry.objects.count() == 1


@pytest.fixture
def tamper(owner_cursor):
    """Change the log behind the application's back, the way an attacker with SQL access would: as the
    tables' owner (on PostgreSQL on a connection of its own), the triggers off."""

    def run(sql: str) -> None:
        with owner_cursor() as c:
            if connection.vendor == "postgresql":
                c.execute(f"ALTER TABLE {LOG} DISABLE TRIGGER USER")
                c.execute(sql)
                c.execute(f"ALTER TABLE {LOG} ENABLE TRIGGER USER")
            else:
                c.execute("DROP TRIGGER audit_entry_no_update")
                c.execute("DROP TRIGGER audit_entry_no_delete")
                c.execute(sql)

    return run


def _three_entries() -> list[AuditEntry]:
    for name in ("a", "b", "c"):
        services.gpu_class_save(
            instance=GPUClass(name=name, memory_mib=10, usable_mib=5, compute_capability="8.0")
        )
    return list(AuditEntry.objects.order_by("id"))


def test_the_chain_links_each_entry_to_the_one_before(actor):
    entries = _three_entries()
    assert [e.prev_hash for e in entries[1:]] == [e.hash for e in entries[:-1]]
    assert verify_chain() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_an_altered_entry_is_detected(actor, tamper):
    entries = _three_entries()
    tamper(f"UPDATE {LOG} SET actor = 'mallory' WHERE id = {entries[1].pk}")
    assert verify_chain() == [
        f"entry #{entries[1].pk}: its content does not match its keyed hash: altered, or not written by us"
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_a_removed_entry_is_detected(actor, tamper):
    entries = _three_entries()
    tamper(f"DELETE FROM {LOG} WHERE id = {entries[1].pk}")
    (problem,) = verify_chain()
    assert problem.startswith(
        f"entry #{entries[2].pk}: it does not follow #{entries[0].pk}: an entry before it"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("audit_flushable")
def test_audit_verify_reports_an_intact_log_and_fails_naming_an_altered_entry(actor, tamper):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    entries = _three_entries()
    out = StringIO()
    call_command("audit_verify", stdout=out)
    assert "intact: 3 entries" in out.getvalue()
    tamper(f"UPDATE {LOG} SET message = 'nothing to see' WHERE id = {entries[0].pk}")
    with pytest.raises(CommandError) as err:
        call_command("audit_verify", stdout=StringIO())
    assert err.value.returncode == 1
    assert f"the first entry that does not match is #{entries[0].pk}" in str(err.value)
    assert f"entry #{entries[0].pk}: its content does not match its keyed hash" in str(err.value)


def test_a_secrets_fingerprint_in_the_log_is_keyed_and_an_older_plain_one_still_verifies(actor, settings):
    """A reader of the log cannot confirm a guessed token against its fingerprint offline (it is an HMAC
    with a key derived from the audit log's); entries written with the older plain fingerprints keep them
    as stored, and the chain, which hashes the stored text, still verifies."""
    import hashlib

    from audit.services import snapshot
    from base.secrets import fingerprint, fingerprint_matches, plain_fingerprint, unmasked_env

    token = "a-token-someone-might-guess"
    node = b.node("gpu-1", agent_token=token)
    logged = snapshot(node)["agent_token"]
    plain = f"sha256:{hashlib.sha256(token.encode()).hexdigest()[:8]}"
    assert logged.startswith("hmac:") and logged != plain
    settings.LLMGW_AUDIT_KEY = "another-audit-key-of-32-characters-or-more"
    assert fingerprint(token) != logged  # the key's, not the token's alone
    settings.LLMGW_AUDIT_KEY = ""
    with transaction.atomic():
        audit_record(action="update", object_type="node", object_key="gpu-1", after={"agent_token": plain})
    assert verify_chain() == []
    assert plain_fingerprint(token) == plain and fingerprint_matches(token, plain)
    assert fingerprint_matches(token, logged) and not fingerprint_matches("guess", logged)
    # A placeholder shown before (the plain form) sent back still keeps the stored value.
    assert unmasked_env({"HF_TOKEN": f"<secret {plain}>"}, {"HF_TOKEN": token}) == {"HF_TOKEN": token}
