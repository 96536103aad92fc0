"""The worker's run of a restart operation, step by step.

``run_operation`` is the body of the worker's task: it claims the operation
(``operations/services/lease.py``: claiming, heartbeats and takeover) and
runs its steps, each one replica:

Rolling (the default, where a node has room; ``rolling.py``): the replacement is placed on
free cards (``operations/services/placement.py``), recorded with its shards, PUT to
its node's agent, and polled until ready; only then is the old replica
stopped and its cards released. A replica is never stopped before its
replacement is ready.

In place (asked for, or no room beside; ``in_place.py``): the old replica is stopped and its
cards released, the replacement starts on the same cards and port, and the
model does not answer while it loads.

A replacement that fails (exit code and log tail), is not ready by its
deadline, or whose agent is down, refuses the token, fails or is too slow,
fails its step: the replacement is stopped and recorded failed with its cards
released; rolling, the old replica keeps serving; in place, the old spec is
started again on its cards. The operation then starts no new step: the steps
left are cancelled and it ends failed (nothing restarted) or partly_failed.

The run in pieces, each one concern:

- ``scheduling.py``: which step runs when, ``max_parallel`` at a time, each in a thread;
- ``steps.py``: one step begun, resumed from its records, or failed as its mode says;
  ``rolling.py`` and ``in_place.py``, the two ways a step goes;
- ``conversation.py``: the calls to the agents (retries, the away window, the long poll, the
  launch policy's digest);
- ``settling.py``: a replacement staying ready for the settle time;
- ``stops.py``: stops confirmed before cards are freed;
- ``records.py``: every row written, with its audit entry, under the lease's fence;
- ``finishing.py``: the end, its state and its summary.

Every row written is audited in the same transaction, by the worker, with the
operator who asked named in the message. Where a run's time goes is logged at
DEBUG (``operations/services/timing.py``).
"""

from __future__ import annotations

import logging
from functools import partial

from django.conf import settings

from base.actor import Actor, acting_as
from operations.models import RestartOperation
from operations.services.lease import Lease, OperationLost, claim, threads_share_the_database, worker_name
from operations.services.runner.conversation import AgentConversation
from operations.services.runner.finishing import finish, give_up, serving_sentence
from operations.services.runner.parts import RunParts
from operations.services.runner.records import Records
from operations.services.runner.scheduling import Scheduler
from operations.services.runner.steps import run_step
from operations.services.timing import RunClock

__all__ = ["OperationRun", "run_operation", "serving_sentence"]

log = logging.getLogger("operations.restart")


def run_operation(operation_id: int, *, worker: str | None = None) -> str:
    """Claim the operation and run it to its end; returns its final state.

    "not_claimed" when it is finished, or held by a live worker; "lost" when
    another worker took it over while this one ran (this one then stops
    without touching anything more).
    """
    worker = worker or worker_name()
    actor = Actor(via="worker", name=worker, request_id=f"restart-{operation_id}")
    with acting_as(actor):
        op = claim(operation_id, worker)
        if op is None:
            return "not_claimed"
        log.info("%s: running restart #%s (attempt %s)", worker, op.pk, op.attempts)
        lease = Lease(op.pk, worker, epoch=op.attempts)
        lease.start()
        try:
            return OperationRun(op, lease, actor).run()
        except OperationLost:
            return "lost"
        finally:
            lease.stop()


class OperationRun:
    """One worker's run of a claimed operation: its records, its conversation with the agents and
    its scheduler, put together."""

    def __init__(self, op: RestartOperation, lease: Lease, actor: Actor):
        self.op = RestartOperation.objects.select_related("model", "profile").get(pk=op.pk)
        self.lease = lease
        self.clock = RunClock(self.op.pk, self.op.max_parallel)
        self.lease.timed = self.clock.add
        self.records = Records(self.op, lease, actor, self.clock)
        self.scheduler = Scheduler(self.op, lease, self.clock, threaded=threads_share_the_database())
        self.parts = RunParts(self.records, AgentConversation(self.records), self.scheduler.slot_free)

    def run(self) -> str:
        """Run the steps to their end, and end the operation; returns its end state."""
        if self.op.attempts > settings.LLMGW_OPERATION_MAX_ATTEMPTS:
            return give_up(self.parts)
        cancelled = self.scheduler.schedule(partial(run_step, self.parts))
        return finish(self.records, cancelled=cancelled)
