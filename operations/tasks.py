"""The worker's tasks: run a restart operation, and sweep for abandoned ones.

Workers are django-tasks-db's ``python manage.py db_worker`` processes; any
number of them may run, on any host, against the same database. How a run
claims its operation, keeps it and is taken over is ``operations/services/lease.py``;
what it does, ``operations/services/runner.py``. This module holds the two
tasks and how they are put in the queue, and nothing else: every read and
write of an operation is in those services.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_tasks import task, task_backends
from django_tasks_db.backend import DatabaseBackend

from operations.services import lease
from operations.services.runner import run_operation

log = logging.getLogger("operations.restart")


@task()
def run_restart(operation_id: int) -> str:
    """Run (or take over) one restart operation; returns its final state."""
    ensure_sweeper()
    return run_operation(operation_id)


@task()
def sweep_restarts() -> list[int]:
    """Enqueue a run for abandoned operations; come back while any is active."""
    enqueued = operations_sweep()
    if lease.any_active():
        ensure_sweeper()
    return enqueued


def _uses_database_backend() -> bool:
    return isinstance(task_backends[run_restart.backend], DatabaseBackend)


def enqueue_restart(operation_id: int) -> str:
    """Enqueue a run of the operation and remember the task's id on it."""
    result = run_restart.enqueue(operation_id)
    lease.record_task(operation_id, str(result.id))
    if _uses_database_backend():
        ensure_sweeper()
    return str(result.id)


def ensure_sweeper() -> None:
    """Make sure a sweep is waiting in the queue (at most one, give or take a race)."""
    if not _uses_database_backend():
        return  # with another backend (immediate, dummy) there is no queue to sweep
    with transaction.atomic():
        if not lease.sweep_is_waiting(sweep_restarts.module_path):
            due = timezone.now() + timedelta(seconds=settings.LLMGW_OPERATION_SWEEP_SECONDS)
            sweep_restarts.using(run_after=due).enqueue()


def operations_sweep() -> list[int]:
    """Enqueue a run for every operation no live worker holds; the ids enqueued."""
    enqueued = lease.abandoned(queued_in_database=_uses_database_backend())
    for operation_id in enqueued:
        log.info("restart #%s: enqueueing a run", operation_id)
        enqueue_restart(operation_id)
    return enqueued
