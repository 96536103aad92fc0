"""One step, from its records: begun (as the restart's plan placed it, else rolling where there is
room and in place where not), resumed where a worker left it, or failed the way its mode says."""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import Q

from catalog.models import Card, Node, Profile, Replica
from operations.models import RestartStep
from operations.services.lease import OperationLost
from operations.services.placement import in_place_cards, release_refusals
from operations.services.placement import replica_ranks as ranks_placed
from operations.services.runner.group_steps import in_place_refusal, is_group_step, old_ranks, place_group
from operations.services.runner.groups import replica_ranks, said_ranks, spans
from operations.services.runner.in_place import begin_in_place, restore, stop_then_start, wait_in_place
from operations.services.runner.parts import RunParts
from operations.services.runner.records import StepFailed
from operations.services.runner.rolling import place_beside, roll, stop_old
from operations.services.runner.stops import stop_replacement
from operations.services.specs import running_spec

log = logging.getLogger("operations.restart")


def run_step(run: RunParts, step_id: int) -> str:
    """Run the step to its end; returns its end state. A step that fails on a bug or a database
    error is failed as its mode says (OperationLost, and a step already ended, are raised)."""
    clock = run.records.clock
    clock.mark(step_id, "began")
    try:
        return _run_step(run, step_id)
    finally:
        clock.mark(step_id, "done")


def _run_step(run: RunParts, step_id: int) -> str:
    step = run.records.step(step_id)
    try:
        if step.state == RestartStep.State.PENDING:
            return _begin(run, step)
        return _resume(run, step)
    except OperationLost:
        raise
    except Exception as exc:  # a bug or a database error: the step fails, the rest is not swallowed
        log.exception("restart #%s step %s failed unexpectedly", run.records.op.pk, step.pk)
        step = run.records.step(step_id)
        if step.is_finished:
            raise
        return fail(run, step, f"The worker failed on this step ({type(exc).__name__}: {exc}); see its log.")


def _begin(run: RunParts, step: RestartStep) -> str:
    records, op = run.records, run.records.op
    old = step.old_replica
    if old is None or not old.is_restartable:
        state = old.state if old is not None else "removed"
        return records.finish_step(
            step,
            RestartStep.State.CANCELLED,
            f"{old.name if old else 'The replica'} is {state}: nothing to restart.",
        )
    ranks = ranks_placed(old)  # its places, and whether it spans nodes, in one read
    if not ranks:
        return records.finish_step(
            step,
            RestartStep.State.FAILED,
            f"{old.name} holds no cards, so there is no node to restart it on.",
        )
    profile = Profile.objects.select_related("model", "gpu_class").get(pk=op.profile_id)
    if is_group_step(profile, old, ranks=ranks):
        return _begin_group(run, step, old, profile)
    _, node, cards = ranks[0]
    old_spec = running_spec(
        old,
        node_cards=cards,
        ready_timeout=records.agent_timeout(),
        profile=profile,
        then_kept=records.profiles_then,
    )
    if step.planned_node:
        return _follow_plan(run, step, old, node, old_spec, profile)
    if not op.in_place:
        if place_beside(run, step, old_spec, profile=profile):
            return roll(run, step)
        if op.in_place is False:
            return records.finish_step(
                step,
                RestartStep.State.FAILED,
                f"No ready node has {op.profile.cards} free card(s) of class "
                f"{op.profile.gpu_class} beside the running replicas, and the restart was asked to be "
                f"rolling only: free cards, or restart in place.{_refused_nodes(op.profile)} "
                f"{old.name} keeps serving.",
            )
    planned = _in_place_cards(run, old, node)
    if isinstance(planned, str):
        return records.finish_step(step, RestartStep.State.FAILED, f"{planned} {old.name} keeps serving.")
    return begin_in_place(run, step, old, node, planned, old_spec)


def _begin_group(run: RunParts, step: RestartStep, old: Replica, profile: Profile) -> str:
    """A step whose replacement spans nodes, or whose old replica does (groups.py, group_steps.py):
    the plan's places for every rank followed where they are still free, else the group's best fit,
    else in place on the old replica's own cards rank for rank (where the shapes match)."""
    records, op = run.records, run.records.op
    olds = old_ranks(run, old) if spans(old) else []
    ranks = replica_ranks(old)
    head = Node.objects.get(name=ranks[0][1])
    old_spec = (
        olds[0]["spec"]
        if olds
        else running_spec(old, node_cards=ranks[0][2], ready_timeout=records.agent_timeout())
    )
    records.set_step(step, old_ranks=olds, old_spec=old_spec)
    group = max(profile.nodes, 1) > 1

    def place(planned: list[dict[str, Any]] | None = None) -> bool:
        if group:
            return place_group(run, step, planned=planned)
        at = (planned[0]["node"], list(planned[0]["cards"])) if planned else None
        return place_beside(run, step, old_spec, planned=at, profile=profile)

    if step.planned_node or step.planned_ranks:
        planned = step.planned_ranks or [
            {"rank": 0, "node": step.planned_node, "cards": list(step.planned_cards)}
        ]
        if not step.planned_in_place:
            if place(planned) or place():
                return roll(run, step)
            return records.finish_step(
                step,
                RestartStep.State.FAILED,
                f"The fleet changed since the restart was planned: {old.name}'s replacement was to start on "
                f"{said_ranks(planned)}, and those cards are no longer free on ready nodes. {old.name} keeps "
                "serving; restart again to plan anew.",
            )
    elif not op.in_place:
        if place():
            return roll(run, step)
        if op.in_place is False:
            return records.finish_step(
                step,
                RestartStep.State.FAILED,
                f"No whole group of {max(profile.nodes, 1)} ready node(s) of one fabric domain has "
                f"{profile.cards // max(profile.nodes, 1)} free card(s) of class {profile.gpu_class} each beside "
                f"the running replicas, and the restart was asked to be rolling only: free whole nodes, or "
                f"restart in place.{_refused_nodes(profile)} {old.name} keeps serving.",
            )
    if group:
        # In place, a group takes the plan's places (every rank of the old replica stopped first), else
        # the old replica's own cards rank for rank; the step's node is the old replica's own until
        # the new group is recorded (its stop is asked there).
        if not (step.planned_in_place and step.planned_ranks):
            refusal = in_place_refusal(profile, old)
            if refusal:
                return records.finish_step(
                    step, RestartStep.State.FAILED, f"{refusal} {old.name} keeps serving."
                )
        return begin_in_place(run, step, old, head, list(ranks[0][2]), old_spec)
    # One node in place of a group: on rank 0's node, its own cards and free ones there.
    if step.planned_in_place and step.planned_node:
        return begin_in_place(
            run, step, old, Node.objects.get(name=step.planned_node), list(step.planned_cards), old_spec
        )
    cards = _in_place_cards(run, old, head)
    if isinstance(cards, str):
        return records.finish_step(step, RestartStep.State.FAILED, f"{cards} {old.name} keeps serving.")
    return begin_in_place(run, step, old, head, cards, old_spec)


def _refused_nodes(profile: Profile) -> str:
    """The nodes the profile's release cannot run on, said after a step that found no place."""
    said = release_refusals(profile)
    return f" Nodes its release cannot run on: {' '.join(said)}" if said else ""


def _in_place_cards(run: RunParts, old: Replica, node: Node) -> list[int] | str:
    profile = Profile.objects.select_related("gpu_class").get(pk=run.records.op.profile_id)
    return in_place_cards(profile, old, node)


def _follow_plan(
    run: RunParts,
    step: RestartStep,
    old: Replica,
    node: Node,
    old_spec: dict[str, Any] | None,
    profile: Profile,
) -> str:
    """The step as the restart's plan placed it (restart_start played the whole
    restart through); when the fleet changed since, the step fails saying how."""
    op = run.records.op
    planned = list(step.planned_cards)
    where = f"{step.planned_node} cards {', '.join(map(str, planned))}"
    if step.planned_in_place:
        usable = _in_place_cards(run, old, node)
        own_and_free = set(
            Card.objects.filter(node=node, gpu_class_id=op.profile.gpu_class_id)
            .filter(Q(shard__isnull=True) | Q(shard__replica=old))
            .values_list("index", flat=True)
        )
        if isinstance(usable, str) or node.name != step.planned_node or not set(planned) <= own_and_free:
            return run.records.finish_step(
                step,
                RestartStep.State.FAILED,
                f"The fleet changed since the restart was planned: {old.name} was to restart in place on "
                f"{where}, and those cards are no longer its own or free. {old.name} keeps serving.",
            )
        return begin_in_place(run, step, old, node, planned, old_spec)
    # The plan assumed the steps before this one succeeded; when one did not (or the fleet moved),
    # the best fit now stands in for it.
    placed = place_beside(run, step, old_spec, planned=(step.planned_node, planned), profile=profile)
    if placed or place_beside(run, step, old_spec, profile=profile):
        return roll(run, step)
    return run.records.finish_step(
        step,
        RestartStep.State.FAILED,
        f"The fleet changed since the restart was planned: {old.name}'s replacement was to start on {where}, "
        f"and those cards are no longer free on a ready node. {old.name} keeps serving; restart again to plan "
        "anew.",
    )


def _resume(run: RunParts, step: RestartStep) -> str:
    """A step a worker left in flight: pick it up where the records say it was."""
    new = step.new_replica
    if new is not None and new.state == Replica.State.STOPPING:
        # A replacement whose stop was not confirmed: ask again before anything else.
        reason = stop_replacement(run.agents, step, StepFailed(step.reason or f"{new.name} failed"))
        if step.in_place:
            return restore(run, step, reason)
        return run.records.finish_step(step, RestartStep.State.FAILED, reason)
    if step.in_place:
        if new is None:
            return stop_then_start(run, step)
        if new.is_live:
            return wait_in_place(run, step)
        return restore(run, step, step.reason or f"{new.name} failed")
    if new is None:
        return _begin(run, step)
    if step.state == RestartStep.State.STOPPING:
        return stop_old(run, step)
    if new.is_live:
        return roll(run, step)
    return run.records.finish_step(step, RestartStep.State.FAILED, step.reason or f"{new.name} failed")


def fail(run: RunParts, step: RestartStep, reason: str) -> str:
    """Fail a step in flight the way its mode says: stop the replacement, keep or restore the old one."""
    step = run.records.step(step.pk)
    new = step.new_replica
    if (
        not step.in_place
        and step.state == RestartStep.State.STOPPING
        and new is not None
        and new.state == "ready"
    ):
        return stop_old(run, step)  # the replacement is ready: finishing the step beats rolling it back
    if new is not None and new.state in Replica.HOLDING_STATES:
        reason = stop_replacement(run.agents, step, StepFailed(reason))
    if step.in_place and step.old_replica_id and step.node:
        # Whether or not its agent already stopped it: PUTting its spec again is harmless.
        return restore(run, step, reason)
    return run.records.finish_step(step, RestartStep.State.FAILED, reason)
