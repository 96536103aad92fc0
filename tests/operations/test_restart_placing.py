"""A rolling step's placement holds the placement lock, which every other step's placement waits
for, only for what the lock guards: the planned cards still free, the port, the name, and the rows
and audit entry that record them. Under load each query is a round trip the other steps wait for
(docs/benchmarks.md, "The restart fan-out"), so what does not need the lock is read before it.

No agent is needed: the step is placed, not run.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEntry
from catalog.models import Profile, Replica, Shard
from operations.services.lease import Lease, claim
from operations.services.placement import replica_name
from operations.services.runner import OperationRun
from operations.services.runner.placing import Placing, place_together, read_first
from operations.services.runner.rolling import place_beside
from operations.services.start import restart_start
from tests.support import builders as b

pytestmark = pytest.mark.django_db

PLACEMENT_LOCK = "pg_advisory_xact_lock(1819046512)"


def _placed_step(actor):
    """A claimed rolling restart of one replica, with the plan's place for its replacement."""
    gpu = b.node("gpu-1", cards=4)
    profile = b.profile(b.llama_8b("llama"), "h100")
    b.replica(profile, gpu, [0], name="llama-1", port=8001)
    Profile.objects.filter(pk=profile.pk).update(revision=2)
    op = restart_start(model_name="llama", max_parallel=1, settle_seconds=0)
    held = claim(op.pk, "w1")
    assert held is not None
    run = OperationRun(held, Lease(op.pk, "w1", epoch=held.attempts), actor)
    step = run.records.step(op.steps.get().pk)
    assert step.planned_node == "gpu-1" and step.planned_cards
    return run, step


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite takes no placement lock")
def test_a_rolling_placement_runs_ten_queries_under_the_placement_lock(actor):
    run, step = _placed_step(actor)
    with CaptureQueriesContext(connection) as seen:
        assert place_beside(run.parts, step, None, planned=(step.planned_node, list(step.planned_cards)))
    sql = [q["sql"] for q in seen.captured_queries]
    locked = sql[[i for i, q in enumerate(sql) if PLACEMENT_LOCK in q][0] :]
    # The lock; the planned cards still free; the port; the replica names of the model; the
    # replica, its shard and its step; the audit chain's lock with its last hash (one message) and
    # the entry, the chain's lock held from there to the transaction's end (a savepoint's here).
    # The chain's lock and its last hash apart, 11; the profile's release, a second take of the
    # placement lock (the name's) and a query to check the name no one's under it as well, 14.
    assert len(locked) == 10, "\n".join(locked)
    assert sum(PLACEMENT_LOCK in q for q in sql) == 1
    new = Replica.objects.get(pk=step.new_replica_id)
    assert new.name == "llama-2"
    assert list(Shard.objects.filter(replica=new).values_list("card__index", flat=True)) == step.planned_cards


def test_the_next_name_is_above_every_number_any_replica_named_like_the_model_has(actor):
    gpu = b.node("gpu-1", cards=8)
    llama = b.llama_8b("llama")
    profile = b.profile(llama, "h100")
    b.replica(profile, gpu, [0], name="llama-3", port=8001)
    # Another model's replica named like one of ours, and a model whose name starts like ours.
    b.replica(b.profile(b.llama_8b("other"), "h100"), gpu, [1], name="llama-7", port=8002)
    b.replica(b.profile(b.llama_8b("llama-2"), "h100"), gpu, [2], name="llama-2-9", port=8003)
    from django.db import transaction

    with transaction.atomic():
        assert replica_name(llama) == "llama-8"


def test_placements_made_together_never_share_a_card_a_port_or_a_name(actor):
    """A batch (``place_together``) reads every plan's cards once, before any is taken: a plan whose
    cards an earlier placement of the batch took is refused as a taken card would be, and a best fit
    made after them reads what they took."""
    gpu = b.node("gpu-1", cards=8)
    profile = b.profile(b.llama_8b("llama"), "h100")
    for i in range(3):
        b.replica(profile, gpu, [i], name=f"llama-{i + 1}", port=8001 + i)
    Profile.objects.filter(pk=profile.pk).update(revision=2)
    op = restart_start(model_name="llama", max_parallel=3, settle_seconds=0)
    held = claim(op.pk, "w1")
    assert held is not None
    run = OperationRun(held, Lease(op.pk, "w1", epoch=held.attempts), actor)
    a, c, d = (run.records.step(pk) for pk in op.steps.order_by("id").values_list("pk", flat=True))
    asked = [
        Placing(a, None, ("gpu-1", [4]), read_first(run.records)),
        Placing(c, None, ("gpu-1", [4]), read_first(run.records)),  # a stale plan: the card the first took
        Placing(d, None, None, read_first(run.records)),  # the best fit, after both
    ]
    assert place_together(run.records, asked) == [True, False, True]
    new = {s.pk: Replica.objects.get(pk=s.new_replica_id) for s in (a, d)}
    cards = {
        pk: list(Shard.objects.filter(replica=r).values_list("card__index", flat=True))
        for pk, r in new.items()
    }
    assert cards[a.pk] == [4] and cards[d.pk] not in ([4], [0], [1], [2])
    assert len({r.port for r in new.values()}) == 2 and len({r.name for r in new.values()}) == 2
    assert c.new_replica_id is None
    assert (
        AuditEntry.objects.filter(action="start", object_key__in=[r.name for r in new.values()]).count() == 2
    )
