"""The end of a run: the steps not started cancelled, the operation's end state and its summary
(how many replicas were restarted, how many serve the model now, the first failure), audited.
The end changes the operation's row itself, so it holds that row alone."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from catalog.models import Replica
from operations.models import RestartOperation, RestartStep
from operations.services.lease import OperationLost
from operations.services.runner.parts import RunParts
from operations.services.runner.records import Records
from operations.services.runner.steps import fail

log = logging.getLogger("operations.restart")


def serving_sentence(model: str, serving: int) -> str:
    """How many replicas serve the model, in the words an operation's summary uses."""
    if serving == 0:
        return f"{model} has no replica serving now"
    return f"{model} has {serving} replica(s) serving now"


def give_up(run: RunParts) -> str:
    """Workers claimed the operation too often: its steps in flight rolled back, and it ends."""
    op = run.records.op
    reason = (
        f"Workers took this restart up {op.attempts - 1} time(s) without finishing it (the last was "
        f"{op.worker}); it is stopped here, with its steps in flight rolled back."
    )
    for step_id in op.steps.filter(state__in=RestartStep.IN_FLIGHT_STATES).values_list("pk", flat=True):
        fail(run, run.records.step(step_id), reason)
    return finish(run.records, cancelled=False, reason=reason)


def finish(records: Records, *, cancelled: bool, reason: str = "") -> str:
    """End the operation: its pending steps cancelled, its state and summary written and audited;
    returns its end state, or "lost" when another worker holds it now."""
    op = records.op
    now = timezone.now()

    @transaction.atomic
    def write() -> str:
        records.hold(alone=True)
        current = RestartOperation.objects.select_for_update().get(pk=op.pk)
        failed_before = RestartStep.objects.filter(operation=op, state=RestartStep.State.FAILED).exists()
        why = (
            "cancelled by request"
            if cancelled
            else "not started: an earlier step failed"
            if failed_before
            else "not started"
        )
        RestartStep.objects.filter(operation=op, state=RestartStep.State.PENDING).update(
            state=RestartStep.State.CANCELLED, finished_at=now, reason=why
        )
        steps = list(RestartStep.objects.filter(operation=op).select_related("old_replica").order_by("id"))
        ok = [s for s in steps if s.state == RestartStep.State.SUCCEEDED]
        bad = [s for s in steps if s.state == RestartStep.State.FAILED]
        # A cancel that stopped a step under way (a group's ranks, runner/groups.py) cancels the
        # operation even with no step left to start.
        stopped = current.cancel_requested and any(s.state == RestartStep.State.CANCELLED for s in steps)
        if bad:
            state = RestartOperation.State.PARTLY_FAILED if ok else RestartOperation.State.FAILED
        elif cancelled or stopped:
            state = RestartOperation.State.CANCELLED
        else:
            state = RestartOperation.State.SUCCEEDED
        serving = Replica.objects.filter(profile__model_id=op.model_id, state=Replica.State.READY).count()
        summary = _summary(op, steps, ok=ok, bad=bad, serving=serving, cancelled=cancelled or stopped)
        text = f"{reason} {summary}" if reason else summary
        before = {"state": current.state}
        current.state, current.finished_at, current.reason, current.heartbeat_at = state, now, text, now
        current.serving_after = serving
        current.save(update_fields=["state", "finished_at", "reason", "heartbeat_at", "serving_after"])
        records.audit(
            action="restart_finish",
            object_type="restart",
            object_key=str(op.pk),
            object_repr=str(current),
            before=before,
            after={"state": state, "reason": text, "serving": serving},
            message=records.said(f"restart #{op.pk} {state.replace('_', ' ')}: {text}"),
        )
        return state

    try:
        state = write()
    except OperationLost:
        return "lost"
    log.info("restart #%s: %s", op.pk, state)
    return state


def _summary(
    op: RestartOperation,
    steps: list[RestartStep],
    *,
    ok: list[RestartStep],
    bad: list[RestartStep],
    serving: int,
    cancelled: bool,
) -> str:
    """The operation's summary: how many replicas were restarted, how many serve the model now,
    the first failure, and whether the rest was cancelled."""
    summary = f"{len(ok)} of {len(steps)} replica(s) restarted; " + serving_sentence(op.model.name, serving)
    if bad:
        first = bad[0]
        name = first.old_replica.name if first.old_replica is not None else f"step {first.pk}"
        summary += f"; {name}: {first.reason.splitlines()[0] if first.reason else 'failed'}"
        if len(bad) > 1:
            summary += f" (and {len(bad) - 1} more failed)"
    if cancelled:
        summary += "; the rest cancelled on request"
    return summary.rstrip(".") + "."
