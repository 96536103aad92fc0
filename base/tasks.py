"""The task queue's one question every periodic task asks before it enqueues itself again."""

from __future__ import annotations

from django_tasks import TaskResultStatus
from django_tasks_db.models import DBTaskResult

from base.db import hold_lock


def task_is_waiting(task_path: str, *, lock: int) -> bool:
    """Whether a run of the task waits in the queue. Holds ``lock`` until the
    transaction ends, so that two callers do not both enqueue one."""
    hold_lock(lock)
    return DBTaskResult.objects.filter(task_path=task_path, status=TaskResultStatus.READY).exists()
