"""A step, rolling: the replacement is placed on free cards beside the old replica, started
and waited for until ready and settled; only then is the old replica stopped, its cards freed
once its agent confirmed it. A replica is never stopped before its replacement is ready: a
replacement that fails is stopped, and the old replica keeps serving."""

from __future__ import annotations

from typing import Any

from catalog.models import Node, Profile, Replica
from operations.models import RestartStep
from operations.services.placement import replica_ranks
from operations.services.reconcile import node_unreachable
from operations.services.runner.groups import launch_and_settle, said_ranks
from operations.services.runner.parts import RunParts
from operations.services.runner.placing import Placing, place_together, read_first
from operations.services.runner.records import StepFailed, replaced, replacement
from operations.services.runner.stops import stop_confirmed, stop_replacement
from operations.services.runner.together import BatchFailed

# Nodes a replacement is placed on in turn when each one's agent turns out to be down.
PLACE_TRIES = 3


def place_beside(
    run: RunParts,
    step: RestartStep,
    old_spec: dict[str, Any] | None,
    *,
    planned: tuple[str, list[int]] | None = None,
    profile: Profile | None = None,
) -> bool:
    """Record the replacement on free cards beside the old replica: on the
    ``planned`` node and cards when given, else the best fit; False when
    there is no room (or the planned cards are no longer free). Made with the other steps'
    placements asked meanwhile, in one transaction (``placing.py``); alone again when that fails.
    What is read before the placement lock is read here first (``profile``: the step's own)."""
    asked = Placing(step, old_spec, planned, read_first(run.records, profile))
    try:
        return run.placing.do(asked, lambda batch: place_together(run.records, batch))
    except BatchFailed:
        step.refresh_from_db()  # an earlier placement of the batch may have set it, then rolled back
        return place_together(run.records, [asked])[0]


def roll(run: RunParts, step: RestartStep, *, tries: int = 1) -> str:
    """Start the recorded replacement, wait until it is ready and settled, then stop the old replica."""
    new, spec = replacement(step)
    try:
        # The slot is free once the agent says the replacement is ready (with no settle time), not
        # once that is written: the next step's placement overlaps this step's write.
        launch_and_settle(run.agents, step, new, spec, ready=lambda: run.slot_free(step))
    except StepFailed as exc:
        if exc.node_down and tries < PLACE_TRIES and _place_elsewhere(run, step, exc):
            return roll(run, step, tries=tries + 1)
        reason = stop_replacement(run.agents, step, exc)
        ended = RestartStep.State.CANCELLED if exc.cancelled else RestartStep.State.FAILED
        return run.records.finish_step(step, ended, f"{reason} {replaced(step).name} keeps serving.")
    return stop_old(run, step)


def _place_elsewhere(run: RunParts, step: RestartStep, failure: StepFailed) -> bool:
    """The replacement's node does not answer: the node is marked unreachable (placement passes
    over it), the replacement (certainly not started) failed with its cards freed, and a new one
    placed on another node; False when no other node has room."""
    new, _ = replacement(step)
    node = Node.objects.get(name=step.node)
    node_unreachable(node, reason=failure.reason, actor=run.records.actor)
    run.records.replica_change(
        new.pk,
        state=Replica.State.FAILED,
        action="fail",
        release=True,
        reason=failure.reason,
        message=f"{new.name} was not started: {failure.reason} Its replacement goes to another node.",
    )
    return place_beside(run, step, step.old_spec)


def stop_old(run: RunParts, step: RestartStep) -> str:
    """The replacement is ready: free the step's slot, stop the old replica, and end the step."""
    old, (new, _) = replaced(step), replacement(step)
    records = run.records
    run.slot_free(step)
    replaced_by = f"{old.name} replaced by {new.name} {_where(step)}"
    old = Replica.objects.get(pk=old.pk)
    if old.state not in Replica.HOLDING_STATES:
        return records.finish_step(step, RestartStep.State.SUCCEEDED, f"{replaced_by}.")
    ranks = replica_ranks(old)  # its node, and whether it spans nodes, in one read
    node = ranks[0][1] if ranks else None
    # The step's stopping and its end go with the old replica's drain and stop, not apart.
    left = stop_confirmed(
        run.agents,
        old,
        node,
        group=len(ranks) > 1,
        end=Replica.State.STOPPED,
        why=f"{new.name} replaces it and is ready",
        step=step,
        before=None
        if step.state == RestartStep.State.STOPPING
        else {"state": RestartStep.State.STOPPING, "reason": f"{new.name} is ready; stopping {old.name}"},
        succeeded=f"{replaced_by}.",
    )
    records.clock.mark(step.pk, "stopped")
    if left:
        return records.finish_step(
            step,
            RestartStep.State.SUCCEEDED,
            f"{replaced_by}, but {old.name}'s stop is not confirmed: {left} It is recorded as stopping "
            "and keeps its cards until its agent confirms the stop (the reconciler asks again).",
        )
    return RestartStep.State.SUCCEEDED


def _where(step: RestartStep) -> str:
    """Where the step's replacement runs: "on gpu-a cards [0]", or each rank's place across nodes."""
    return (
        f"across {len(step.ranks)} nodes ({said_ranks(step.ranks)})"
        if step.ranks
        else f"on {step.node} cards {step.cards}"
    )
