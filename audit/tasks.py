"""The worker's recurring checkpoint of the audit log (audit/chain.py says why).

The task writes a checkpoint and puts the next one in the queue, due
LLMGW_AUDIT_CHECKPOINT_SECONDS later: every ``db_worker`` starts the chain as
it starts (``audit_checkpoint --schedule`` does the same by hand), and the
worker keeps the schedule by itself. At most one waits in
the queue, under a lock, whoever asks.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_tasks import TaskResultStatus, task, task_backends
from django_tasks_db.backend import DatabaseBackend
from django_tasks_db.models import DBTaskResult

from audit.chain import checkpoint_append, checkpoint_now
from base.db import hold_lock

log = logging.getLogger("audit.checkpoint")
_CHECKPOINTER_LOCK_KEY = 0x6C6C6D68


@task()
def write_checkpoint() -> dict[str, int]:
    """Append a checkpoint to LLMGW_AUDIT_CHECKPOINT_FILE (and log its line), then queue the next."""
    checkpoint = checkpoint_now()
    checkpoint_append(settings.LLMGW_AUDIT_CHECKPOINT_FILE, checkpoint)
    log.info("audit checkpoint %s", checkpoint.line())
    ensure_checkpointer()
    return {"count": checkpoint.count, "last_id": checkpoint.last_id}


def ensure_checkpointer() -> str:
    """Make sure the next checkpoint waits in the queue; when it is due."""
    if not isinstance(task_backends[write_checkpoint.backend], DatabaseBackend):
        return "never: the task backend is not the database's, so no worker keeps a schedule"
    with transaction.atomic():
        hold_lock(_CHECKPOINTER_LOCK_KEY)
        waiting = (
            DBTaskResult.objects.filter(task_path=write_checkpoint.module_path, status=TaskResultStatus.READY)
            .order_by("run_after")
            .first()
        )
        if waiting is not None:
            return f"at {waiting.run_after or 'once a worker is free'}"
        due = timezone.now() + timedelta(seconds=settings.LLMGW_AUDIT_CHECKPOINT_SECONDS)
        write_checkpoint.using(run_after=due).enqueue()
        return f"at {due.isoformat()}"
