"""The worker's telemetry task: sample every node's cards, then come back after
``next_interval`` (LLMGW_TELEMETRY_SECONDS, or three times the round where that is longer:
telemetry/services.py). One chain whoever starts it: a worker starting
(operations' ``db_worker``) makes sure one run waits in the queue, and each run
enqueues the next on that worker's schedule, as the reconciler does
(operations/tasks.py). 0 seconds: the worker does not sample
(``manage.py telemetry_sample --loop`` may then).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_tasks import task, task_backends
from django_tasks_db.backend import DatabaseBackend

from base.tasks import task_is_waiting
from telemetry.services import fleet_sample, next_interval

_SAMPLER_LOCK_KEY = 0x6C6C7473  # "llts"
log = logging.getLogger("telemetry")


@task()
def sample_telemetry() -> dict[str, bool]:
    """One sample of every node; whether each answered."""
    began = time.monotonic()
    try:
        return fleet_sample()
    finally:
        took = time.monotonic() - began
        due_in = next_interval(took)
        log.info("telemetry round: %.2f s; the next in %.1f s", took, due_in)
        ensure_sampler(due_in=due_in)


def ensure_sampler(*, due_in: float) -> None:
    """Make sure a sample waits in the queue (one chain, whoever asks); none when sampling is off."""
    if settings.LLMGW_TELEMETRY_SECONDS <= 0 or not isinstance(
        task_backends[sample_telemetry.backend], DatabaseBackend
    ):
        return
    with transaction.atomic():
        if not task_is_waiting(sample_telemetry.module_path, lock=_SAMPLER_LOCK_KEY):
            sample_telemetry.using(run_after=timezone.now() + timedelta(seconds=due_in)).enqueue()
