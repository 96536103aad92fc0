"""A run's replica writes asked while another is being written go in one transaction
(``Records.replica_change``, ``runner/together.py``): at sixteen steps at once a wave's ready, drain
and stop writes no longer take the audit chain's lock one at a time (docs/benchmarks.md, "The
fan-out at 16: writes made together"). Each change and its audit entry still share a
transaction, and one change that cannot be written fails alone.

No agent is needed: the replicas' records are written, nothing is run.
"""

from __future__ import annotations

import threading

import pytest
from agent_testing import wait_until
from django.db import connection, transaction

from audit.chain import CHAIN_LOCK_KEY
from audit.models import AuditEntry, RowChange
from audit.services import verify_chain
from base.db import hold_lock
from catalog.models import Profile, Replica
from operations.services.lease import Lease, claim
from operations.services.runner import OperationRun
from operations.services.start import restart_start
from tests.support import builders as b

pytestmark = [
    pytest.mark.postgres,  # writes from threads, each with its connection; an advisory lock held
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("audit_flushable"),
]

REPLICAS = 4


def _claimed_run(actor) -> tuple[OperationRun, list[Replica]]:
    gpu = b.node("gpu-1", cards=8)
    profile = b.profile(b.llama_8b("llama"), "h100")
    replicas = [b.replica(profile, gpu, [i], name=f"llama-{i + 1}", port=8001 + i) for i in range(REPLICAS)]
    Profile.objects.filter(pk=profile.pk).update(revision=2)
    op = restart_start(model_name="llama", max_parallel=REPLICAS, settle_seconds=0)
    held = claim(op.pk, "w1")
    assert held is not None
    return OperationRun(held, Lease(op.pk, "w1", epoch=held.attempts), actor), replicas


def _waiting_for_the_chain() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone()[0] == 1


def _drain_all(run: OperationRun, replicas: list[Replica], outcomes: dict[str, object]) -> None:
    """Each replica drained from a thread of its own, the first alone while another transaction
    holds the audit chain's lock, the others asked while it waits."""

    def drain(replica: Replica) -> None:
        try:
            outcomes[replica.name] = run.records.replica_change(
                replica.pk, state="stopping", action="drain", message=f"{replica.name} drains"
            ).state
        except Exception as exc:  # what this thread's own change raised
            outcomes[replica.name] = exc
        finally:
            connection.close()  # the thread's own

    threads = [threading.Thread(target=drain, args=(r,)) for r in replicas]
    with transaction.atomic():
        hold_lock(CHAIN_LOCK_KEY)  # another audited write of the fleet, under way
        threads[0].start()
        wait_until(_waiting_for_the_chain, timeout=10, what="the first write waiting for the chain")
        for t in threads[1:]:
            t.start()
        wait_until(
            lambda: run.records._replica_writes.queued() == REPLICAS - 1,
            timeout=10,
            what="three writes queued",
        )
    for t in threads:
        t.join(timeout=30)


def test_replica_writes_asked_while_one_is_written_go_in_one_transaction(actor):
    run, replicas = _claimed_run(actor)
    outcomes: dict[str, object] = {}
    _drain_all(run, replicas, outcomes)

    assert outcomes == {r.name: "stopping" for r in replicas}
    assert set(Replica.objects.filter(pk__in=[r.pk for r in replicas]).values_list("state", flat=True)) == {
        "stopping"
    }
    drained = dict(AuditEntry.objects.filter(action="drain").values_list("object_key", "txid"))
    assert set(drained) == {r.name for r in replicas}
    # The first alone, the three asked while it waited in one transaction: one wait for the chain.
    first = replicas[0].name
    assert len({drained[n] for n in drained if n != first}) == 1
    assert len(set(drained.values())) == 2
    # Each replica's row (the database's own trigger saw it) is written in its entry's transaction.
    updated = dict(
        RowChange.objects.filter(table_name="catalog_replica", operation="UPDATE").values_list(
            "row_key", "txid"
        )
    )
    assert all(updated[str(r.pk)] == drained[r.name] for r in replicas)
    assert verify_chain() == []


def test_a_change_that_cannot_be_written_fails_alone_and_the_others_of_its_batch_are_written(actor):
    run, replicas = _claimed_run(actor)
    gone = replicas[2]
    # Removed behind the run's back (an editor's delete): its drain cannot be written.
    Replica.objects.filter(pk=gone.pk).delete()
    outcomes: dict[str, object] = {}
    _drain_all(run, replicas, outcomes)

    assert isinstance(outcomes.pop(gone.name), Replica.DoesNotExist)
    assert outcomes == {r.name: "stopping" for r in replicas if r is not gone}
    drained = dict(AuditEntry.objects.filter(action="drain").values_list("object_key", "txid"))
    assert set(drained) == {r.name for r in replicas if r is not gone}
    # The batch that failed was written again one change a transaction.
    assert len(set(drained.values())) == 3
    assert verify_chain() == []


def test_a_batch_of_different_changes_leaves_each_replica_as_its_change_alone_would(actor):
    # One batch: a stop that frees its cards and ends its step, a ready with the engine's memory
    # report, and an in-place start that frees its cards and takes another; each replica ends as
    # its change alone leaves it, each entry says what it was before and after.
    from catalog.models import Node, Shard
    from operations.models import RestartStep
    from operations.services.runner.records import ReplicaChange

    run, replicas = _claimed_run(actor)
    records = run.records
    stopped, readied, moved = replicas[0], replicas[1], replicas[2]
    step = records.step(RestartStep.objects.filter(old_replica=stopped).get().pk)
    gpu = Node.objects.get(name="gpu-1")

    def change(replica: Replica, state: str, action: str, **kw) -> ReplicaChange:
        fields = dict(
            release=False, hold=None, hold_ranks=None, memory=None, reason=None, step=None, step_fields=None
        )
        return ReplicaChange(replica.pk, state, action, f"{replica.name} {action}", **{**fields, **kw})

    ended = records.finished("succeeded", "llama-1 replaced")
    outcome = records._write_replicas(
        [
            change(stopped, "stopped", "stop", release=True, reason="replaced", step=step, step_fields=ended),
            change(readied, "ready", "ready", memory={"kv_cache_gib": 12.5}),
            change(moved, "starting", "start", release=True, hold=(gpu, [6])),
        ]
    )
    assert [r.name for r in outcome] == [stopped.name, readied.name, moved.name]

    by_name = {r.name: r for r in Replica.objects.filter(pk__in=[r.pk for r in replicas])}
    assert (by_name["llama-1"].state, by_name["llama-1"].reason) == ("stopped", "replaced")
    assert by_name["llama-2"].state == "ready" and by_name["llama-2"].measured_memory == {
        "kv_cache_gib": 12.5
    }
    assert by_name["llama-2"].planned_memory  # what its cards were planned to hold, kept beside it
    assert by_name["llama-3"].state == "starting"
    assert by_name["llama-4"].state == "ready"  # not in the batch
    held = {
        name: sorted(Shard.objects.filter(replica__name=name).values_list("card__index", flat=True))
        for name in by_name
    }
    assert held == {"llama-1": [], "llama-2": [1], "llama-3": [6], "llama-4": [3]}
    assert RestartStep.objects.filter(pk=step.pk).values_list("state", "reason").get() == (
        "succeeded",
        "llama-1 replaced",
    )

    entries = {
        e.object_key: e
        for e in AuditEntry.objects.filter(object_type="replica", action__in=["stop", "ready", "start"])
    }
    assert len({e.txid for e in entries.values()}) == 1
    assert entries["llama-1"].before["cards"] == ["gpu-1#0"] and entries["llama-1"].after["cards"] == []
    assert entries["llama-3"].before["cards"] == ["gpu-1#2"] and entries["llama-3"].after["cards"] == [
        "gpu-1#6"
    ]
    assert entries["llama-2"].before["state"] == "ready" and entries["llama-2"].after["cards"] == ["gpu-1#1"]
    assert verify_chain() == []
