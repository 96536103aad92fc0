"""A step, in place: the old replica is stopped first (confirmed, or the step fails: a stop that
certainly never reached the agent changes nothing; one that may have is recorded ``stopping``),
the replacement starts on its cards and port, waits until ready and settles; the model does not
answer while it loads. When the replacement fails, the old replica's recorded spec is started
again on its cards (``restore``)."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from catalog.models import Card, Node, Profile, Replica, Shard
from operations.models import RestartStep
from operations.services.runner.conversation import certainly_not_reached
from operations.services.runner.group_steps import swap_group
from operations.services.runner.groups import launch_and_settle, launch_group, said_ranks, stop_every_rank
from operations.services.runner.parts import RunParts
from operations.services.runner.records import StepFailed, replaced, replacement
from operations.services.runner.stops import drain_first, stop_confirmed, stop_replacement, with_stop_note

IN_PLACE_WHY = "stopped to restart it in place"


def begin_in_place(
    run: RunParts,
    step: RestartStep,
    old: Replica,
    node: Node,
    cards: list[int],
    old_spec: dict[str, Any] | None,
) -> str:
    """Record the step in place on ``cards`` of ``node`` (the old replica's, or free beside them),
    with the spec the old replica runs, then stop it and start its replacement there."""
    run.records.set_step(
        step,
        in_place=True,
        state=RestartStep.State.STOPPING,
        started_at=timezone.now(),
        node=node.name,
        cards=cards,
        old_spec=old_spec,
        reason=f"stopping {old.name} to free its cards",
    )
    return stop_then_start(run, step)


def stop_then_start(run: RunParts, step: RestartStep) -> str:
    """Stop the old replica (confirmed), then record its replacement on its cards and start it."""
    old = Replica.objects.get(pk=replaced(step).pk)
    node = Node.objects.get(name=step.node)
    if old.state in Replica.HOLDING_STATES:
        not_stopped = _stop_first(run, step, old, node)
        if not_stopped is not None:
            return not_stopped
    with run.records.clock.timed("write: an in-place swap (transaction)"):
        swapped = _swap(run, step, old, node)
    run.records.clock.mark(step.pk, "placed")
    if swapped is None:
        return restore(
            run,
            step,
            f"The cards {list(step.cards)} of {node.name} were taken by another "
            "replica before the replacement could start.",
        )
    return wait_in_place(run, step)


def _stop_first(run: RunParts, step: RestartStep, old: Replica, node: Node) -> str | None:
    """Stop the old replica on its agent: None once confirmed, else the step ended failed (the old
    replica unchanged when the stop certainly never reached the agent, else recorded stopping)."""
    records = run.records
    drained = old.state == Replica.State.READY
    if drained:
        # As a rolling step's stop does: no new work for it, its requests in flight let finish.
        drain_first(run.agents, old, IN_PLACE_WHY)
    if step.old_ranks:  # every rank stopped first, rank 0 first
        confirmed, failures, note = stop_every_rank(run.agents, old)
        failure = failures[0] if failures else None
        if failure is not None:
            failure.message = " ".join(f.message for f in failures)
        untouched = not confirmed and all(certainly_not_reached(f) for f in failures)
        run.agents.keep_stop_note(old.name, note)
    else:
        failure = run.agents.confirm_stop(node, old.name)
        untouched = failure is not None and certainly_not_reached(failure)
    if failure is None:
        return None
    if untouched and old.state != Replica.State.STOPPING:
        if drained:
            records.replica_change(
                old.pk,
                state=Replica.State.READY,
                action="ready",
                reason="",
                message=f"{old.name} takes work again: its stop never reached its agent "
                f"({failure.message}), so it kept running",
            )
        return records.finish_step(
            step,
            RestartStep.State.FAILED,
            f"{old.name} could not be stopped to free its cards: {failure.message} "
            f"Nothing was changed: {old.name} is still recorded as {old.state}.",
        )
    records.replica_change(
        old.pk,
        state=Replica.State.STOPPING,
        action="stop_unconfirmed",
        reason=failure.message,
        message=f"{old.name} was asked to stop to restart it in place, and its agent did not "
        f"confirm it: {failure.message} It keeps its cards until the agent does.",
    )
    return records.finish_step(
        step,
        RestartStep.State.FAILED,
        f"{old.name} could not be confirmed stopped to free its cards: {failure.message} It is "
        "recorded as stopping and keeps its cards until its agent confirms the stop (the "
        "reconciler asks again); nothing was started in its place.",
    )


@transaction.atomic
def _swap(run: RunParts, step: RestartStep, old: Replica, node: Node) -> Replica | None:
    """In one transaction, the old replica (its agent confirmed the stop) recorded stopped with its
    cards freed, and its replacement recorded on the step's cards and its port; None when another
    replica took one of those cards meanwhile."""
    records = run.records
    records.hold()
    profile = Profile.objects.select_related("model").get(pk=records.op.profile_id)
    current = Replica.objects.select_for_update().get(pk=old.pk)
    if max(profile.nodes, 1) > 1:  # a new group: the plan's places, or the old group's cards rank for rank
        why = with_stop_note(IN_PLACE_WHY, run.agents.stop_said(current.name))
        return swap_group(run, step, current, why)
    if Shard.objects.filter(card__node=node, card__index__in=step.cards).exclude(replica=current).exists():
        return None  # another replica took a free card meanwhile
    if current.state in Replica.HOLDING_STATES:
        records.stop_for_in_place(
            current, node, step.cards, reason=with_stop_note(IN_PLACE_WHY, run.agents.stop_said(current.name))
        )
    return records.record_replacement(
        step,
        profile,
        node,
        list(Card.objects.filter(node=node, index__in=step.cards).select_related("node").order_by("index")),
        port=current.port,
        said=lambda new, port: (
            f"started {new} in place of {current.name} on {node.name} cards "
            f"{list(step.cards)} port {port}, revision {profile.revision}"
        ),
        reason=lambda new: f"starting {new} in place of {current.name}",
    )


def wait_in_place(run: RunParts, step: RestartStep) -> str:
    """Start the replacement recorded in place and wait until it is ready and settled; the old spec
    again when it fails."""
    new, spec = replacement(step)
    try:
        launch_and_settle(run.agents, step, new, spec)
    except StepFailed as exc:
        return restore(run, step, stop_replacement(run.agents, step, exc), cancelled=exc.cancelled)
    where = (
        f"across {len(step.ranks)} nodes ({said_ranks(step.ranks)})"
        if step.ranks
        else f"on {step.node} cards {step.cards}"
    )
    return run.records.finish_step(
        step, RestartStep.State.SUCCEEDED, f"{replaced(step).name} replaced in place by {new.name} {where}."
    )


def restore(run: RunParts, step: RestartStep, reason: str, *, cancelled: bool = False) -> str:
    """Start the old replica again, with the spec it ran, on its cards. ``cancelled``: the
    replacement was stopped by a cancel (a group's, runner/groups.py), not by a failure."""
    records = run.records
    old = Replica.objects.get(pk=replaced(step).pk)
    if step.old_ranks:
        return _restore_group(run, step, old, reason, cancelled=cancelled)
    if not step.old_spec:
        return records.finish_step(
            step,
            RestartStep.State.FAILED,
            f"{reason} The spec {old.name} ran before is not known, so it was not "
            "started again: start it by hand.",
        )
    node = Node.objects.get(name=step.node)
    records.set_step(step, state=RestartStep.State.STARTING, reason=f"{reason} Starting {old.name} again.")
    if not old.is_live:
        try:
            old = records.replica_change(
                old.pk,
                state=Replica.State.STARTING,
                action="start",
                hold=(node, list(step.old_spec["cards"])),
                message=f"started {old.name} again with its previous spec: its replacement did not come up",
            )
        except IntegrityError:
            return records.finish_step(
                step,
                RestartStep.State.FAILED,
                f"{reason} {old.name} was not started again: its cards were taken meanwhile.",
            )
    try:
        run.agents.launch_and_wait(step, old, step.old_spec)
    except StepFailed as exc:
        return _not_restored(run, step, old, node, reason, exc)
    return records.finish_step(
        step,
        RestartStep.State.FAILED,
        f"{reason} {old.name} was started again with its previous spec and is ready.",
    )


def _not_restored(
    run: RunParts, step: RestartStep, old: Replica, node: Node, reason: str, exc: StepFailed
) -> str:
    """The old replica did not come back either: stopped (confirmed) or recorded failed; the step
    fails saying both."""
    left = ""
    if exc.started:
        left = stop_confirmed(
            run.agents, old, node, end=Replica.State.FAILED, why=f"it did not come back: {exc.reason}"
        )
    else:
        run.records.replica_change(
            old.pk,
            state=Replica.State.FAILED,
            action="fail",
            release=True,
            reason=exc.reason,
            message=f"{old.name} did not come back: {exc.reason}",
        )
    held = f" It could not be stopped either: {left}" if left else ""
    return run.records.finish_step(
        step,
        RestartStep.State.FAILED,
        f"{reason} {old.name} could not be started again either: {exc.reason}{held}",
    )


def _restore_group(run: RunParts, step: RestartStep, old: Replica, reason: str, *, cancelled: bool) -> str:
    """Start every rank of the old replica again with the spec it ran, on its cards, rank for rank.
    Back and ready after a cancel, the step ends cancelled (as a rolling one does): nothing failed."""
    records = run.records
    if any(not r.get("spec") for r in step.old_ranks):
        return records.finish_step(
            step,
            RestartStep.State.FAILED,
            f"{reason} The specs {old.name}'s ranks ran before are not known, so it was not started again: "
            "start it by hand.",
        )
    records.set_step(step, state=RestartStep.State.STARTING, reason=f"{reason} Starting {old.name} again.")
    if not old.is_live:
        nodes = {n.name: n for n in Node.objects.filter(name__in=[r["node"] for r in step.old_ranks])}
        try:
            old = records.replica_change(
                old.pk,
                state=Replica.State.STARTING,
                action="start",
                hold_ranks=[(int(r["rank"]), nodes[r["node"]], list(r["cards"])) for r in step.old_ranks],
                message=f"started {old.name} again with its previous specs, every rank "
                f"({said_ranks(step.old_ranks)}): its replacement did not come up",
            )
        except IntegrityError:
            return records.finish_step(
                step,
                RestartStep.State.FAILED,
                f"{reason} {old.name} was not started again: its cards were taken meanwhile.",
            )
    try:
        launch_group(run.agents, step, old, field="old_ranks")
    except StepFailed as exc:
        left = stop_confirmed(
            run.agents, old, None, end=Replica.State.FAILED, why=f"it did not come back: {exc.reason}"
        )
        held = f" It could not be stopped either: {left}" if left else ""
        return records.finish_step(
            step,
            RestartStep.State.FAILED,
            f"{reason} {old.name} could not be started again either: {exc.reason}{held}",
        )
    return records.finish_step(
        step,
        RestartStep.State.CANCELLED if cancelled else RestartStep.State.FAILED,
        f"{reason} {old.name} was started again with its previous specs, every rank, and is ready.",
    )
