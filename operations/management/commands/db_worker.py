"""django-tasks-db's worker, which first puts this project's periodic tasks on its own schedule.

``operations`` is listed before ``django_tasks_db`` in INSTALLED_APPS so that
``python manage.py db_worker`` is this command.
"""

from __future__ import annotations

from typing import Any

from django_tasks_db.management.commands.db_worker import Command as DatabaseWorkerCommand

from audit.tasks import ensure_checkpointer
from operations.tasks import start_worker_schedule
from telemetry.tasks import ensure_sampler


class Command(DatabaseWorkerCommand):
    help = (
        "Run the task worker (django-tasks-db's db_worker): restarts, their sweep, and the reconciler, which "
        "compares the catalog with what every node's agent runs every LLMGW_RECONCILE_SECONDS, and the cards' "
        "telemetry every LLMGW_TELEMETRY_SECONDS, and the audit log's signed checkpoint every "
        "LLMGW_AUDIT_CHECKPOINT_SECONDS. Run one or more."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        start_worker_schedule()
        ensure_sampler(due_in=0)  # the cards' telemetry, every LLMGW_TELEMETRY_SECONDS
        ensure_checkpointer()  # the audit log's checkpoint, every LLMGW_AUDIT_CHECKPOINT_SECONDS
        super().handle(*args, **options)
