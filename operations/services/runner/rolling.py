"""A step, rolling: the replacement is placed on free cards beside the old replica, started
and waited for until ready and settled; only then is the old replica stopped, its cards freed
once its agent confirmed it. A replica is never stopped before its replacement is ready: a
replacement that fails is stopped, and the old replica keeps serving."""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from catalog.models import Card, Node, Profile, Replica
from catalog.selectors import release_of
from operations.models import RestartStep
from operations.services.placement import (
    best_fit,
    foreign_held_card_ids,
    free_port,
    node_hosts,
    orphan_cards,
    release_refusal,
    replica_placement,
)
from operations.services.reconcile import node_unreachable
from operations.services.runner.groups import launch_and_settle, said_ranks
from operations.services.runner.parts import RunParts
from operations.services.runner.records import StepFailed, replaced, replacement
from operations.services.runner.stops import stop_confirmed, stop_replacement

# Nodes a replacement is placed on in turn when each one's agent turns out to be down.
PLACE_TRIES = 3


def place_beside(
    run: RunParts,
    step: RestartStep,
    old_spec: dict[str, Any] | None,
    *,
    planned: tuple[str, list[int]] | None = None,
) -> bool:
    """Record the replacement on free cards beside the old replica: on the
    ``planned`` node and cards when given, else the best fit; False when
    there is no room (or the planned cards are no longer free)."""
    records = run.records
    locked_at: list[float] = []  # when the placement lock was taken: how long it was held, timed

    @transaction.atomic
    def write() -> bool:
        records.hold()
        # What no placement changes is read before the placement lock, which every step's
        # placement waits for in turn (each query under it is a round trip every other step
        # waits for): the profile, its release, the cards a foreign process holds (the sampler's,
        # not a placement's), the nodes' hosts. Whether the cards are still free, the port and the
        # name, after.
        profile = Profile.objects.select_related("model", "gpu_class").get(pk=records.op.profile_id)
        foreign = foreign_held_card_ids() if planned is not None else None
        release = release_of(profile) if planned is not None else None
        hosts = node_hosts()
        records.lock_placement()
        locked_at.append(time.monotonic())
        fit = (
            _planned_cards(profile, *planned, foreign=foreign or set(), release=release)
            if planned is not None
            else best_fit(profile, replacing=step.old_replica)
        )
        if fit is None:
            return False
        node, cards = fit
        old = replaced(step)
        records.record_replacement(
            step,
            profile,
            node,
            cards,
            port=free_port(node, hosts=hosts),
            said=lambda new, port: (
                f"started {new} on {node.name} cards {[c.index for c in cards]} port {port}, "
                f"revision {profile.revision}, to replace {old.name}"
            ),
            reason=lambda new: f"starting {new} on {node.name} beside {old.name}",
            started_at=timezone.now(),
            old_spec=old_spec,
            in_place=False,
            locked=True,
        )
        return True

    with records.clock.timed("write: placing a replacement (transaction)"):
        placed = write()
    if locked_at:  # every other placement waited this long: the lock is held to the commit
        records.clock.add(
            "hold: the placement lock (a rolling placement, to its commit)", time.monotonic() - locked_at[0]
        )
    if placed:
        records.clock.mark(step.pk, "placed")
    return placed


def _planned_cards(
    profile: Profile, node_name: str, indices: list[int], *, foreign: set[int], release: str | None = None
) -> tuple[Node, list[Card]] | None:
    """The cards the restart's plan gave the step, when they are still free on a ready node (and
    are as many as the profile takes, none in ``foreign``: held by a foreign process, and the node
    able to run ``release``, the profile's); None otherwise."""
    cards = list(
        Card.objects.filter(
            node__name=node_name,
            node__state=Node.State.READY,
            node__reachable=True,
            gpu_class_id=profile.gpu_class_id,
            shard__isnull=True,
            cordoned=False,
            index__in=indices,
        )
        .exclude(pk__in=foreign)  # a foreign process took one since the plan
        .select_related("node")
        .order_by("index")
    )
    if len(cards) != len(indices) or len(cards) != profile.cards:
        return None
    if release_refusal(profile, cards[0].node, release=release) is not None:
        return None  # the node's agent since reported facts the release's floors refuse
    if orphan_cards(cards[0].node) & set(indices):
        return None  # an orphan engine runs there: the best fit stands in
    return cards[0].node, cards


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
    if step.state != RestartStep.State.STOPPING:
        records.set_step(
            step, state=RestartStep.State.STOPPING, reason=f"{new.name} is ready; stopping {old.name}"
        )
    old = Replica.objects.get(pk=old.pk)
    if old.state in Replica.HOLDING_STATES:
        node, _ = replica_placement(old)
        left = stop_confirmed(
            run.agents, old, node, end=Replica.State.STOPPED, why=f"{new.name} replaces it and is ready"
        )
        records.clock.mark(step.pk, "stopped")
        if left:
            return records.finish_step(
                step,
                RestartStep.State.SUCCEEDED,
                f"{old.name} replaced by {new.name} {_where(step)}, but {old.name}'s stop "
                f"is not confirmed: {left} It is recorded as stopping and keeps its cards until its agent "
                "confirms the stop (the reconciler asks again).",
            )
    return records.finish_step(
        step,
        RestartStep.State.SUCCEEDED,
        f"{old.name} replaced by {new.name} {_where(step)}.",
    )


def _where(step: RestartStep) -> str:
    """Where the step's replacement runs: "on gpu-a cards [0]", or each rank's place across nodes."""
    return (
        f"across {len(step.ranks)} nodes ({said_ranks(step.ranks)})"
        if step.ranks
        else f"on {step.node} cards {step.cards}"
    )
