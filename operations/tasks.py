"""The worker's tasks: run a restart operation, sweep for abandoned ones, reconcile the fleet.

Workers are django-tasks-db's ``python manage.py db_worker`` processes (this
project's ``db_worker`` command, which schedules the periodic tasks as it
starts); any number of them may run, on any host, against the same database.
How a run claims its operation, keeps it and is taken over is
``operations/services/lease.py``; what it does, ``operations/services/runner/``;
the reconciler, ``operations/services/reconcile.py``. This module holds the
tasks and how they are put in the queue, and nothing else.

The periodic tasks keep the workers' own schedule: each enqueues its next run
itself, from a worker, ``LLMGW_OPERATION_SWEEP_SECONDS`` or
``LLMGW_RECONCILE_SECONDS`` of *the worker's* settings later; a web process
that wants a sweep enqueues one due at once, which a worker runs and then
re-enqueues on its own schedule.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_tasks import task, task_backends
from django_tasks_db.backend import DatabaseBackend

from base.tasks import task_is_waiting
from operations.services import lease
from operations.services.reconcile import reconcile
from operations.services.release_watch import latest_check, record_check
from operations.services.runner import run_operation

log = logging.getLogger("operations.restart")


@task()
def run_restart(operation_id: int) -> str:
    """Run (or take over) one restart operation; returns its final state."""
    ensure_sweeper(due_in=settings.LLMGW_OPERATION_SWEEP_SECONDS)
    ensure_reconciler(due_in=settings.LLMGW_RECONCILE_SECONDS)
    return run_operation(operation_id)


@task()
def sweep_restarts() -> list[int]:
    """Enqueue a run for abandoned operations; come back while any is active."""
    try:
        return operations_sweep()
    finally:
        if lease.any_active():
            ensure_sweeper(due_in=settings.LLMGW_OPERATION_SWEEP_SECONDS)


@task()
def reconcile_fleet() -> dict[str, Any]:
    """One reconciler pass over every node; come back every LLMGW_RECONCILE_SECONDS."""
    try:
        return reconcile().as_dict()
    finally:
        ensure_reconciler(due_in=settings.LLMGW_RECONCILE_SECONDS)


@task()
def watch_releases() -> list[dict[str, Any]]:
    """Ask the package index for each engine's newest release and keep the answer; come back in
    LLMGW_RELEASE_WATCH_SECONDS (a day)."""
    try:
        return record_check().results
    finally:
        ensure_release_watch(due_in=settings.LLMGW_RELEASE_WATCH_SECONDS)


def ensure_release_watch(*, due_in: float | None = None) -> None:
    """Make sure a release check waits in the queue (one chain, whoever asks): due ``due_in`` seconds
    from now, or by default a day after the last answer kept (at once when there is none). None when
    the watch is off (``LLMGW_RELEASE_WATCH_SECONDS`` 0)."""
    every = settings.LLMGW_RELEASE_WATCH_SECONDS
    if every <= 0 or not _uses_database_backend():
        return
    if due_in is None:
        last = latest_check()
        due_in = 0.0 if last is None else max((last.checked_at - timezone.now()).total_seconds() + every, 0.0)
    with transaction.atomic():
        if not task_is_waiting(watch_releases.module_path, lock=_RELEASE_WATCH_LOCK_KEY):
            watch_releases.using(run_after=timezone.now() + timedelta(seconds=due_in)).enqueue()


_RELEASE_WATCH_LOCK_KEY = 0x6C6C7277  # "llrw"


def _uses_database_backend() -> bool:
    return isinstance(task_backends[run_restart.backend], DatabaseBackend)


def enqueue_restart(operation_id: int, *, sweep_due_in: float = 0.0) -> str:
    """Enqueue a run of the operation and remember the task's id on it; make sure a sweep waits
    (due in ``sweep_due_in`` seconds: at once from a web process, on its own schedule from a worker)."""
    result = run_restart.enqueue(operation_id)
    lease.record_task(operation_id, str(result.id))
    if _uses_database_backend():
        ensure_sweeper(due_in=sweep_due_in)
    return str(result.id)


def ensure_sweeper(*, due_in: float) -> None:
    """Make sure a sweep is waiting in the queue (at most one, give or take a race)."""
    if not _uses_database_backend():
        return  # with another backend (immediate, dummy) there is no queue to sweep
    with transaction.atomic():
        if not lease.sweep_is_waiting(sweep_restarts.module_path):
            sweep_restarts.using(run_after=timezone.now() + timedelta(seconds=due_in)).enqueue()


def ensure_reconciler(*, due_in: float) -> None:
    """Make sure a reconciler pass is waiting in the queue (one chain, whoever asks)."""
    if not _uses_database_backend():
        return
    with transaction.atomic():
        if not task_is_waiting(reconcile_fleet.module_path, lock=lease.RECONCILER_LOCK_KEY):
            reconcile_fleet.using(run_after=timezone.now() + timedelta(seconds=due_in)).enqueue()


def start_worker_schedule() -> None:
    """What a worker does as it starts: the reconciler's chain, and the sweep while an operation is active,
    both on this worker's schedule."""
    ensure_reconciler(due_in=0)
    ensure_release_watch()
    if lease.any_active():
        ensure_sweeper(due_in=settings.LLMGW_OPERATION_SWEEP_SECONDS)


def operations_sweep() -> list[int]:
    """Enqueue a run for every operation no live worker holds; the ids enqueued."""
    enqueued = lease.abandoned(queued_in_database=_uses_database_backend())
    for operation_id in enqueued:
        log.info("restart #%s: enqueueing a run", operation_id)
        enqueue_restart(operation_id, sweep_due_in=settings.LLMGW_OPERATION_SWEEP_SECONDS)
    return enqueued
