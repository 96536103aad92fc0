"""The worker's hold on a restart operation: claiming it, its heartbeat, and takeover.

Workers are django-tasks-db's ``python manage.py db_worker`` processes; any
number of them may run, on any host, against the same database.

Claiming. A task carries only the operation's id. The worker that runs it
claims the operation row in one short transaction: the row is read with
``SELECT ... FOR UPDATE SKIP LOCKED`` (PostgreSQL; SQLite runs write
transactions one at a time) and only if it is *claimable* — queued, or
running with a heartbeat older than ``LLMGW_OPERATION_STALE_SECONDS`` — is it
set to running with this worker's name, a fresh heartbeat and one more
attempt. A second worker holding a task for the same operation finds it
locked or no longer claimable and returns "not_claimed" without touching
anything, so two workers never run the same operation, hence never the same
step.

Heartbeat and fencing. Each claim is numbered (``attempts``: the lease's
*epoch*). While it runs, the worker writes ``heartbeat_at`` every
``LLMGW_OPERATION_HEARTBEAT_SECONDS`` from a thread of its own, so that a long
agent call (a stop waiting for an engine, a long poll) does not starve it,
with ``WHERE worker = me AND attempts = my epoch AND state = running``. And
every write the runner makes (a step's state, a replica, its cards, the end)
first locks the operation's row under the same condition (``Lease.hold``), in
the write's own transaction: once another worker has claimed the operation,
the first one's next write matches nothing, and it stops there, touching
nothing more. So a worker that was paused, or cut off, for longer than the
stale threshold cannot write a step another worker now runs, nor anything
after the operation ended. The settings refuse a stale threshold that is not
above the longest agent call a worker makes (``llmgw_web/settings.py``).

Takeover. django-tasks-db has no lease: a worker killed mid-task leaves its
task "RUNNING" forever and nobody runs it again. So a *sweep* looks for
operations no live worker holds — running with a stale heartbeat, or queued
with no task waiting for a worker — and enqueues a new task for each. The
worker that runs it claims the operation (its heartbeat is stale) and
continues where the records say it was: every step records its replacement
(replica row, shards, and the exact spec sent to the agent) before the PUT,
so a step in flight is resumed by PUTting the same spec again (harmless: the
agent answers 200 for a live replica with the same spec) and polling; a step
that was stopping the old replica stops it again (also harmless). An
operation claimed more than ``LLMGW_OPERATION_MAX_ATTEMPTS`` times is not run
again: its steps in flight are rolled back and it ends failed, saying why.

The sweep runs: as a task of its own that re-enqueues itself every
``LLMGW_OPERATION_SWEEP_SECONDS`` of the worker's settings while any
operation is queued or running (every restart task, and every worker as it
starts, make sure one is waiting; a web process enqueueing a restart asks for
one due at once, so the period is always the workers'); and from ``python manage.py operations_sweep
[--loop]`` (cron, or the demo launcher). With the defaults (stale 60 s,
sweep 30 s) a killed worker's operation is taken up again within about 90 s,
as long as another worker is free: a db_worker runs one task at a time, so
run two or more.

Limits: a fenced worker may still have an agent call in flight when it
loses its hold (its answer is then dropped); the worker that took over reads
the records afresh and carries on from them, and the agents are only ever
sent the spec recorded for a replica, so the call repeated is harmless.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from django_tasks import TaskResultStatus
from django_tasks_db.models import DBTaskResult

from audit.services import audit_record
from base.actor import Actor
from base.tasks import task_is_waiting
from operations.models import RestartOperation

log = logging.getLogger("operations.restart")

_SWEEPER_LOCK_KEY = 0x6C6C7377  # "llsw": one sweeper chain
# An operation queued this recently may still be waiting for its transaction's on_commit enqueue.
ENQUEUE_GRACE_SECONDS = 5


class OperationLost(Exception):
    """Another worker holds the operation now: this one stops without touching anything more."""


def worker_name() -> str:
    """``worker:<hostname>-<pid>``: who the audit log says acted, and who holds an operation."""
    return f"worker:{socket.gethostname()}-{os.getpid()}"


# --- claiming and the heartbeat -----------------------------------------------------------------


def _stale_before() -> datetime:
    return timezone.now() - timedelta(seconds=settings.LLMGW_OPERATION_STALE_SECONDS)


def _claimable() -> Q:
    running = RestartOperation.State.RUNNING
    return Q(state=RestartOperation.State.QUEUED) | (
        Q(state=running) & (Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=_stale_before()))
    )


def claim(operation_id: int, worker: str) -> RestartOperation | None:
    """Take the operation for ``worker``: the operation, or None when it is not claimable."""
    with transaction.atomic():
        qs = RestartOperation.objects.filter(_claimable(), pk=operation_id)
        if connection.vendor == "postgresql":
            qs = qs.select_for_update(skip_locked=True, of=("self",))
        op = qs.select_related("model").first()
        if op is None:
            return None
        previous, last_beat = op.worker, op.heartbeat_at
        now = timezone.now()
        op.state, op.worker, op.heartbeat_at = RestartOperation.State.RUNNING, worker, now
        op.attempts += 1
        op.started_at = op.started_at or now
        op.save(update_fields=["state", "worker", "heartbeat_at", "attempts", "started_at"])
        if previous:
            audit_record(
                action="restart_takeover",
                object_type="restart",
                object_key=str(op.pk),
                object_repr=str(op),
                before={"worker": previous},
                after={"worker": worker, "attempt": op.attempts},
                actor=Actor(via="worker", name=worker, request_id=f"restart-{op.pk}"),
                message=f"restart #{op.pk} of {op.model.name} (asked by {op.requested_by_name}) taken over from "
                f"{previous}, whose last heartbeat was at {last_beat:%Y-%m-%d %H:%M:%S} UTC",
            )
    return op


def threads_share_the_database() -> bool:
    """False for an in-memory SQLite database (the tests'): its connections
    lock whole tables, so threads with connections of their own would trip
    over each other (steps then run one after the other, heartbeats inline)."""
    name = str(connection.settings_dict.get("NAME") or "")
    return connection.vendor != "sqlite" or not (name == ":memory:" or "mode=memory" in name)


class Lease:
    """This worker's hold on an operation, claim number ``epoch``.

    ``start()`` beats from a thread of its own (``tick()`` then only says
    whether the hold was lost); without it, ``tick()`` beats inline. ``hold()``,
    inside a write's transaction, locks the operation's row if this worker
    still holds it, and raises ``OperationLost`` if not. Safe to call from
    several threads, each with its own database connection.
    """

    def __init__(self, operation_id: int, worker: str, *, epoch: int | None = None):
        self.operation_id = operation_id
        self.worker = worker
        self.epoch = epoch  # None: any claim of this worker's (tests that build a lease by hand)
        self.interval = settings.LLMGW_OPERATION_HEARTBEAT_SECONDS
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = threading.Event()
        # Told how long each heartbeat took (the run's clock, operations/services/timing.py).
        self.timed: Callable[[str, float], None] | None = None

    def _mine(self) -> Q:
        q = Q(pk=self.operation_id, worker=self.worker, state=RestartOperation.State.RUNNING)
        return q if self.epoch is None else q & Q(attempts=self.epoch)

    # -- the heartbeat ------------------------------------------------------------------------

    def start(self) -> None:
        """Beat from a thread until ``stop()`` (or the hold is lost)."""
        if self._thread is not None or not threads_share_the_database():
            return
        self._thread = threading.Thread(
            target=self._beat_until_stopped, name=f"heartbeat-{self.operation_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _beat_until_stopped(self) -> None:
        try:
            while not self._stopped.wait(self.interval) and not self.lost.is_set():
                with self._lock:
                    try:
                        self._beat()
                    except OperationLost:
                        return
        finally:
            connection.close()  # the thread's own connection

    def tick(self) -> None:
        """Raise ``OperationLost`` once the hold is lost; beat inline when no thread beats."""
        if self.lost.is_set():
            raise OperationLost()
        if self._thread is not None:
            return
        if time.monotonic() - self._last < self.interval or not self._lock.acquire(blocking=False):
            return
        try:
            self._beat()
        finally:
            self._lock.release()

    def _beat(self) -> None:
        began = time.monotonic()
        try:
            held = RestartOperation.objects.filter(self._mine()).update(heartbeat_at=timezone.now())
        except OperationalError:  # a busy database: the next beat tries again, well before the threshold
            log.warning("restart #%s: heartbeat not written", self.operation_id, exc_info=True)
            return
        if self.timed is not None:
            self.timed("heartbeat (waits for the operation's row)", time.monotonic() - began)
        self._last = time.monotonic()
        if not held:
            self._lose()

    # -- the fence ----------------------------------------------------------------------------

    def hold(self, *, alone: bool = False) -> None:
        """In a write's transaction: lock the operation's row while this worker holds it;
        ``OperationLost`` (and nothing written) once another worker has claimed it.

        On PostgreSQL the steps' writes share the lock (``FOR KEY SHARE``): they commit side by
        side rather than one after the other, and a claim or a cancel (``FOR UPDATE``) still waits
        for every one of them, so none commits once another worker holds the operation. The
        heartbeat's update (``FOR NO KEY UPDATE``) waits for none of them, nor they for it: under
        ``FOR SHARE`` it queued behind the writes under way and every new write queued behind it,
        so one beat stalled the whole run for up to 1.8 s (docs/benchmarks.md, the fan-out at
        16). ``alone``: the row locked for this write only (``FOR UPDATE``), for a write that
        changes the row itself (the run's end): a shared lock would have to be raised, and two
        raising deadlock."""
        if self.lost.is_set():
            raise OperationLost()
        mine = RestartOperation.objects.filter(self._mine()).values_list("pk")
        if alone or connection.vendor != "postgresql":
            held = bool(list(mine.select_for_update()[:1]))
        else:
            sql, params = mine.query.sql_with_params()
            with connection.cursor() as cursor:
                cursor.execute(f"{sql} FOR KEY SHARE", params)
                held = cursor.fetchone() is not None
        if not held:
            self._lose()

    def _lose(self) -> None:
        if not self.lost.is_set():
            log.warning(
                "restart #%s: taken over by another worker; %s (claim %s) stops here",
                self.operation_id,
                self.worker,
                self.epoch,
            )
        self.lost.set()
        raise OperationLost()


# --- the queue ----------------------------------------------------------------------------------


def record_task(operation_id: int, task_id: str) -> None:
    """Remember the latest task enqueued for the operation (the sweep reads it)."""
    RestartOperation.objects.filter(pk=operation_id).update(task_id=task_id)


RECONCILER_LOCK_KEY = 0x6C6C7263  # "llrc": one reconciler chain


def sweep_is_waiting(sweep_task_path: str) -> bool:
    """Whether a sweep waits in the queue (under the sweeper's lock)."""
    return task_is_waiting(sweep_task_path, lock=_SWEEPER_LOCK_KEY)


def any_active() -> bool:
    return RestartOperation.objects.filter(state__in=RestartOperation.ACTIVE_STATES).exists()


def _task_state(task_id: str, *, queued_in_database: bool) -> tuple[str, datetime | None] | None:
    if not task_id or not queued_in_database:
        return None
    try:
        return DBTaskResult.objects.filter(id=task_id).values_list("status", "started_at").first()
    except (ValidationError, ValueError):
        return None


def abandoned(*, queued_in_database: bool) -> list[int]:
    """The operations no live worker holds, which need a run enqueued.

    Running with a stale heartbeat, unless a run for it already waits; queued
    with no task waiting or running for it (the enqueue was lost, or the worker
    that took the task died before claiming). ``queued_in_database``: tasks go
    through django-tasks-db, whose rows say what is waiting.
    """
    stale = _stale_before()
    grace = timezone.now() - timedelta(seconds=ENQUEUE_GRACE_SECONDS)
    found = []
    for op in RestartOperation.objects.filter(state__in=RestartOperation.ACTIVE_STATES).order_by("id"):
        task_state = _task_state(op.task_id, queued_in_database=queued_in_database)
        status, task_started = task_state if task_state else (None, None)
        if op.state == RestartOperation.State.RUNNING:
            if op.heartbeat_at is not None and op.heartbeat_at >= stale:
                continue  # alive
            if status == TaskResultStatus.READY:
                continue  # a run is already waiting for a worker
        else:
            if status == TaskResultStatus.READY:
                continue
            if status == TaskResultStatus.RUNNING and task_started is not None and task_started >= stale:
                continue  # a worker is about to claim it
            if task_state is None and op.created_at >= grace:
                continue
        log.info("restart #%s (%s) has no live worker", op.pk, op.state)
        found.append(op.pk)
    return found
