"""A run's rolling placements asked while another is being made are made together, in one
transaction (``operations/services/runner/placing.py``): the 16-wide fan-out's placements no longer
take the fleet's placement lock one at a time (docs/benchmarks.md, "Issue 25, item 4: placements made
together"). Made together, they still never share a card, a port or a name, and each replacement's
rows and its audit entry are written in one transaction.

No agent is needed: the steps are placed, not run.
"""

from __future__ import annotations

import threading

import pytest
from agent_testing import wait_until
from django.db import connection, transaction

from audit.models import AuditEntry, RowChange
from audit.services import verify_chain
from base.db import hold_lock
from catalog.models import Profile, Replica, Shard
from operations.services.lease import Lease, claim
from operations.services.placement import _PLACEMENT_LOCK_KEY
from operations.services.runner import OperationRun
from operations.services.runner.rolling import place_beside
from operations.services.start import restart_start
from tests.support import builders as b

pytestmark = [
    pytest.mark.postgres,  # steps placed from threads, each with its connection; an advisory lock held
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("audit_flushable"),
]

STEPS = 4


def _claimed_run(actor):
    """A claimed rolling restart of four replicas on one node, each planned onto a free card."""
    gpu = b.node("gpu-1", cards=8)
    profile = b.profile(b.llama_8b("llama"), "h100")
    for i in range(STEPS):
        b.replica(profile, gpu, [i], name=f"llama-{i + 1}", port=8001 + i)
    Profile.objects.filter(pk=profile.pk).update(revision=2)
    op = restart_start(model_name="llama", max_parallel=STEPS, settle_seconds=0)
    held = claim(op.pk, "w1")
    assert held is not None
    run = OperationRun(held, Lease(op.pk, "w1", epoch=held.attempts), actor)
    steps = [run.records.step(pk) for pk in op.steps.order_by("id").values_list("pk", flat=True)]
    assert all(s.planned_node == "gpu-1" and s.planned_cards for s in steps)
    return run, steps


def _waiting_for_the_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone()[0] == 1


def test_placements_asked_while_one_is_made_are_made_together_in_one_transaction(actor):
    run, steps = _claimed_run(actor)
    placed: dict[int, bool] = {}

    def place(step) -> None:
        try:
            placed[step.pk] = place_beside(
                run.parts, step, None, planned=(step.planned_node, step.planned_cards)
            )
        finally:
            connection.close()  # the thread's own

    threads = [threading.Thread(target=place, args=(s,)) for s in steps]
    # Another placement (another run's, another worker's) holds the fleet's placement lock: the first
    # step's placement waits for it, and the other three are asked meanwhile.
    with transaction.atomic():
        hold_lock(_PLACEMENT_LOCK_KEY)
        threads[0].start()
        wait_until(_waiting_for_the_lock, timeout=10, what="the first placement waiting for the lock")
        for t in threads[1:]:
            t.start()
        wait_until(
            lambda: run.parts.placing.queued() == STEPS - 1, timeout=10, what="three placements queued"
        )
    for t in threads:
        t.join(timeout=30)
    assert placed == {s.pk: True for s in steps}

    new = list(Replica.objects.filter(state=Replica.State.STARTING).order_by("name"))
    assert [r.name for r in new] == ["llama-5", "llama-6", "llama-7", "llama-8"]
    cards = list(Shard.objects.filter(replica__in=new).values_list("card__index", flat=True))
    assert sorted(cards) == [4, 5, 6, 7]  # the plan's, one each
    assert len({r.port for r in new}) == STEPS  # one host (127.0.0.1): four ports
    assert min(r.port for r in new) > 8004

    started = {e.object_key: e.txid for e in AuditEntry.objects.filter(action="start")}
    assert set(started) == {r.name for r in new}
    # The first alone, the three asked while it waited in one transaction: one wait for the lock.
    first = steps[0].new_replica.name if steps[0].new_replica else ""
    assert first in started
    assert len({started[n] for n in started if n != first}) == 1
    assert len(set(started.values())) == 2
    # Each replacement's row (the database's own trigger saw it) is written in its entry's transaction.
    inserted = dict(
        RowChange.objects.filter(table_name="catalog_replica", operation="INSERT").values_list(
            "row_key", "txid"
        )
    )
    assert all(inserted[str(r.pk)] == started[r.name] for r in new)
    assert verify_chain() == []
