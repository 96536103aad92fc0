"""The lease's fence and the periodic tasks' schedule, in this process on the database alone."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone
from django_tasks import TaskResultStatus
from django_tasks_db.models import DBTaskResult

from audit.models import AuditEntry
from base.actor import Actor
from operations.models import RestartOperation, RestartStep
from operations.services.lease import Lease, OperationLost, claim
from operations.services.runner import OperationRun
from operations.services.runner.finishing import finish
from operations.services.start import restart_start
from operations.tasks import enqueue_restart, reconcile_fleet, start_worker_schedule, sweep_restarts
from tests.support import builders as b

MODEL = "llama-3.1-8b"


@pytest.fixture
def operation(actor):
    node = b.node("gpu-1", cards=2)
    b.replica(b.profile(b.llama_8b(MODEL)), node, [0], name="llama-1")
    return restart_start(model_name=MODEL, replicas=["llama-1"])


@pytest.mark.django_db
def test_a_worker_taken_over_writes_nothing_more(operation):
    first = claim(operation.pk, "worker:first-1")
    assert first is not None
    lease = Lease(operation.pk, "worker:first-1", epoch=first.attempts)
    run = OperationRun(first, lease, Actor(via="worker", name="worker:first-1"))
    step = run.records.step(operation.steps.get().pk)
    run.records.set_step(step, reason="written while it holds the operation")

    RestartOperation.objects.filter(pk=operation.pk).update(
        heartbeat_at=timezone.now() - timedelta(seconds=60)
    )
    second = claim(operation.pk, "worker:second-2")
    assert second is not None and second.attempts == first.attempts + 1
    entries = AuditEntry.objects.count()
    with pytest.raises(OperationLost):
        run.records.set_step(step, reason="written after the takeover")
    with pytest.raises(OperationLost):
        run.records.replica_change(step.old_replica_id, state="stopped", action="stop", message="not written")
    assert finish(run.records, cancelled=False) == "lost"
    assert RestartStep.objects.get(pk=step.pk).reason == "written while it holds the operation"
    assert RestartOperation.objects.get(pk=operation.pk).state == "running"
    assert AuditEntry.objects.count() == entries


@pytest.mark.django_db
def test_the_same_worker_claiming_again_fences_out_its_earlier_claim(operation):
    # The epoch, not the name, says whose the operation is: a worker process reused by name is not let in.
    first = claim(operation.pk, "worker:same-1")
    old = Lease(operation.pk, "worker:same-1", epoch=first.attempts)
    RestartOperation.objects.filter(pk=operation.pk).update(
        heartbeat_at=timezone.now() - timedelta(seconds=60)
    )
    assert claim(operation.pk, "worker:same-1") is not None
    from django.db import transaction

    with pytest.raises(OperationLost), transaction.atomic():
        old.hold()


def sweeps() -> list[DBTaskResult]:
    return list(
        DBTaskResult.objects.filter(
            task_path=sweep_restarts.module_path, status=TaskResultStatus.READY
        ).order_by("enqueued_at")
    )


@pytest.mark.django_db
def test_a_sweep_asked_for_outside_a_worker_is_due_at_once_and_then_keeps_the_workers_schedule(
    operation, settings
):
    DBTaskResult.objects.all().delete()
    before = timezone.now()
    enqueue_restart(operation.pk)  # as the web process does on commit, whatever its own sweep setting
    (due_now,) = sweeps()
    assert due_now.run_after is not None and due_now.run_after - before < timedelta(seconds=1)

    # A worker runs it, with settings of its own: the next one is due on the worker's schedule.
    settings.LLMGW_OPERATION_SWEEP_SECONDS = 7
    DBTaskResult.objects.filter(pk=due_now.pk).update(status=TaskResultStatus.SUCCESSFUL)
    sweep_restarts.call()
    (following,) = sweeps()
    assert timedelta(seconds=6) < following.run_after - timezone.now() <= timedelta(seconds=7)


@pytest.mark.django_db
def test_a_worker_starting_schedules_one_reconciler_pass_and_each_pass_the_next(settings):
    DBTaskResult.objects.all().delete()
    settings.LLMGW_RECONCILE_SECONDS = 11
    start_worker_schedule()
    start_worker_schedule()  # a second worker starting: still one chain
    waiting = DBTaskResult.objects.filter(
        task_path=reconcile_fleet.module_path, status=TaskResultStatus.READY
    )
    assert waiting.count() == 1
    waiting.update(status=TaskResultStatus.SUCCESSFUL)
    assert reconcile_fleet.call() == {"nodes": 0, "unreachable": [], "changes": [], "orphans": {}}
    (next_pass,) = waiting.all()
    assert timedelta(seconds=10) < next_pass.run_after - timezone.now() <= timedelta(seconds=11)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_steps_writes_hold_the_fence_side_by_side_and_a_takeover_waits_for_them(operation):
    # Every write of a run first holds the operation's row: exclusively, the steps running in
    # threads wrote one after the other (half of a fan-out's time went waiting there). Shared,
    # they write at once, and a takeover still cannot come between a write's check and its commit.
    from django.db import connection, transaction

    first = claim(operation.pk, "worker:first-1")
    lease = Lease(operation.pk, "worker:first-1", epoch=first.attempts)
    RestartOperation.objects.filter(pk=operation.pk).update(
        heartbeat_at=timezone.now() - timedelta(seconds=60)  # stale: another worker may claim it
    )
    with _a_step_writing(lease):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            lease.hold()  # another step's write, while the first is under way: not kept waiting
        assert claim(operation.pk, "worker:second-2") is None  # a write is under way: not now
    second = claim(operation.pk, "worker:second-2")
    assert second is not None and second.attempts == first.attempts + 1
    with pytest.raises(OperationLost), transaction.atomic():
        lease.hold()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_goes_through_while_a_step_writes_and_a_cancel_waits_for_the_write(operation, actor):
    # The steps' writes hold the operation's row FOR KEY SHARE: the heartbeat's update of the same
    # row does not conflict with it (under FOR SHARE it waited for every write under way, 6.7 s at
    # sixteen steps at once), while a cancel's FOR UPDATE still waits for the write's commit.
    from django.db import connection, transaction
    from django.db.utils import OperationalError

    from operations.services.start import operation_cancel

    first = claim(operation.pk, "worker:first-1")
    lease = Lease(operation.pk, "worker:first-1", epoch=first.attempts)
    with _a_step_writing(lease):
        beat_before = RestartOperation.objects.get(pk=operation.pk).heartbeat_at
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            lease._beat()  # within the lock timeout, while the write is under way
        assert RestartOperation.objects.get(pk=operation.pk).heartbeat_at > beat_before
        assert not lease.lost.is_set()
        with pytest.raises(OperationalError, match="lock timeout"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '500ms'")
            operation_cancel(operation_id=operation.pk)
    assert not RestartOperation.objects.get(pk=operation.pk).cancel_requested  # nothing half-written
    assert operation_cancel(operation_id=operation.pk).cancel_requested


@contextlib.contextmanager
def _a_step_writing(lease: Lease) -> Iterator[None]:
    """A step's write under way meanwhile, from a thread of its own: its transaction holds the
    fence (``lease.hold()``) until the block ends."""
    from django.db import connection, transaction

    holding, release = threading.Event(), threading.Event()

    def write() -> None:
        try:
            with transaction.atomic():
                lease.hold()
                holding.set()
                release.wait(timeout=30)
        finally:
            connection.close()  # the thread's own

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert holding.wait(timeout=10)
        yield
    finally:
        release.set()
        writer.join(timeout=30)
