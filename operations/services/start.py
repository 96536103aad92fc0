"""Starting and cancelling restarts: what the edges call (pages, API, command, the resize).

``restart_start`` records the operation and one step per replica, audits it,
and enqueues the worker's task when the transaction commits;
``operation_cancel`` asks it to stop. The worker's side is
``operations/services/runner/``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.services import audit_record
from base.actor import Actor, current_actor
from base.errors import DomainError, conflict, not_found
from catalog.models import Node, Profile, Replica, ServedModel, restartable_replicas_q, stale_replicas_q
from catalog.services.fit import refuse_unless_fits
from operations.models import RestartOperation, RestartStep
from operations.selectors import rooms_and_fleet
from operations.services.busy import busy_refusal
from operations.services.placement import release_refusal
from operations.services.specs import check_launchable
from operations.tasks import enqueue_restart
from planning import engines
from planning.groups import Span, place_group_restart
from planning.placement import LiveReplica, NodeCards, Placement, place_restart
from planning.types import NodeRoom

MAX_PARALLEL = 32
MAX_READY_TIMEOUT = 24 * 3600.0


def _operation_after(op: RestartOperation, names: list[str]) -> dict[str, Any]:
    return {
        "model": op.model.name,
        "profile": op.profile.name,
        "state": op.state,
        "mode": op.mode,
        "in_place": op.in_place,
        "max_parallel": op.max_parallel,
        "ready_timeout": op.ready_timeout,
        "settle_seconds": op.settle_seconds,
        "stop_at_first_failure": op.stop_at_first_failure,
        "requested_by": op.requested_by_name,
        "via": op.via,
        "replicas": names,
        "cause": op.cause,
        "target_revision": op.target_revision,
    }


def _chosen_replicas(model: ServedModel, names: list[str] | None) -> list[Replica]:
    # A replica whose node does not answer ("unknown") is restarted too: its replacement goes elsewhere.
    live = Replica.objects.filter(restartable_replicas_q(), profile__model=model).select_related("profile")
    if names:
        chosen = []
        for name in dict.fromkeys(names):
            replica = Replica.objects.select_related("profile__model").filter(name=name).first()
            if replica is None:
                raise not_found(f"No replica {name!r} in the catalog.")
            if replica.profile.model_id != model.pk:
                raise DomainError(
                    "other_model",
                    f"Replica {name} serves {replica.profile.model.name}, not {model.name}: restart it as "
                    f"{replica.profile.model.name}'s, or leave it out of {model.name}'s restart.",
                )
            if not replica.is_restartable:
                names = [r.name for r in live.order_by("name")]
                raise conflict(
                    "not_live",
                    f"Replica {name} is {replica.state}: only starting, loading, ready or unknown "
                    "replicas are restarted. "
                    + (
                        f"Leave it out: {model.name}'s live replicas are {', '.join(names)}."
                        if names
                        else f"{model.name} has no live replica; a replica that stopped is not started again "
                        "by a restart."
                    ),
                )
            chosen.append(replica)
        return chosen
    chosen = list(live.filter(stale_replicas_q()).order_by("name"))
    if not chosen:
        count = live.count()
        raise conflict(
            "nothing_to_restart",
            f"{model.name} has no live replica to restart."
            if not count
            else f"All {count} live replica(s) of {model.name} run their profile's current revision: name the ones "
            'to restart anyway (--replica NAME, or "replicas" in the API).',
        )
    return chosen


def _check_restartable(model: ServedModel, profile: Profile) -> None:
    engines.engine(profile.engine)  # unknown_engine, with the known ones
    check_launchable(model=model, engine=profile.engine, args=list(profile.args), env=dict(profile.env))
    if profile.gpu_class_id is None:
        raise DomainError(
            "cpu_only",
            f"{model.name}'s {profile.name} profile runs on CPUs: restarts go through a "
            "node's agent and need cards; give the profile a GPU class first.",
        )
    nodes = max(profile.nodes, 1)
    if nodes > 1:
        # A replica across nodes runs as a group of ranks (runner/groups.py), where its engine can.
        refusal = engines.span_refusal(engines.engine(profile.engine))
        if refusal is not None:
            raise DomainError(
                "multi_node",
                f"{model.name}'s {profile.name} profile spreads a replica over {nodes} nodes, and "
                f"{profile.engine} cannot: {refusal}. Give it one node's cards (nodes 1), or another engine.",
            )
        if max(profile.pp, 1) > 1 and profile.pp != nodes:
            # Each rank is told the group's size as its stages (engines.group_widths): the cards held
            # (× pp) would not be the cards the engine uses (× nodes).
            raise DomainError(
                "multi_node",
                f"{model.name}'s {profile.name} profile runs {profile.pp} pipeline stages over {nodes} nodes, "
                "which restarts do not handle: across nodes a stage runs a node. Set pp to the nodes "
                f"({nodes}), or resize it (the model page's resize form plans the stages).",
            )
    elif max(profile.pp, 1) > 1:
        raise DomainError(
            "multi_node",
            f"{model.name}'s {profile.name} profile runs {profile.pp} pipeline stages on one node, which "
            "restarts do not handle: pipeline stages run one a node (set nodes to the stages), or set pp to 1.",
        )


def _plan(
    profile: Profile,
    chosen: list[Replica],
    *,
    in_place: bool | None,
    max_parallel: int,
    avoid_nodes: tuple[str, ...] = (),
    only_nodes: tuple[str, ...] = (),
) -> dict[str, Placement]:
    """Every chosen replica's place, played through as the runner will take
    them; refuses (409) naming the replica with none, so that a restart that
    cannot finish does not start. No replacement goes on ``avoid_nodes`` (a
    move's or a drain's own node), nor, when ``only_nodes`` names some, on any other (a move's
    chosen target)."""
    rooms, fleet = rooms_and_fleet(profile, parallel=max_parallel)
    if fleet is None:
        return {}
    if avoid_nodes or only_nodes:
        fleet = replace(
            fleet,
            cards=tuple(
                replace(c, ready=False)
                if c.node in avoid_nodes or (only_nodes and c.node not in only_nodes)
                else c
                for c in fleet.cards
            ),
        )
    # A node the profile's release cannot run on (its floors, or the release not installed there) takes
    # no replacement; where that leaves none, the refusal names the floor and the figures.
    refused = {
        node.name: err
        for node in Node.objects.filter(name__in=[c.node for c in fleet.cards])
        if (err := release_refusal(profile, node)) is not None
    }
    if refused:
        fleet = replace(
            fleet, cards=tuple(replace(c, ready=False) if c.node in refused else c for c in fleet.cards)
        )
    names = {r.name for r in chosen}
    replicas = tuple(replace(r, restarted=r.name in names) for r in fleet.replicas)
    gpu_class = profile.gpu_class.name if profile.gpu_class else ""
    try:
        if max(profile.nodes, 1) > 1:
            places = _plan_groups(
                profile,
                rooms,
                fleet.cards,
                replicas,
                in_place=in_place,
                parallel=max_parallel,
                refused=refused,
            )
        else:
            places = place_restart(
                fleet.cards,
                replicas,
                profile.cards,
                in_place=in_place is not False,
                always_in_place=in_place is True,
                parallel=max_parallel,
                gpu_class=gpu_class,
            )
    except DomainError as err:
        if not refused:
            raise
        first = refused[min(refused)]
        raise DomainError(first.code, f"{err.message} {first.message}", status=first.status) from None
    return {p.replica: p for p in places}


def _plan_groups(
    profile: Profile,
    rooms: list[NodeRoom],
    cards: tuple[NodeCards, ...],
    replicas: tuple[LiveReplica, ...],
    *,
    in_place: bool | None,
    parallel: int,
    refused: dict[str, DomainError],
) -> tuple[Placement, ...]:
    """Every rank of every replacement across nodes, in restart order (``place_group_restart``: whole
    nodes of one fabric domain, class and release, room beside first). A restart asked to be in place
    takes each old replica's own cards rank for rank, as the runner does (runner/group_steps.py),
    where its shape is the profile's; refused (409, ``no_room``) naming the replica otherwise."""
    nodes = max(profile.nodes, 1)
    span = Span(nodes=nodes, per_node=profile.cards // nodes)
    gpu_class = profile.gpu_class.name if profile.gpu_class else ""
    if in_place is not True:
        return place_group_restart(
            cards,
            replicas,
            span,
            in_place=in_place is None,
            rooms=rooms,
            gpu_class=gpu_class,
            parallel=parallel,
            refused={node: err.message for node, err in refused.items()},
        )
    places = []
    for old in sorted((r for r in replicas if r.restarted), key=lambda r: r.name):
        own = old.places
        if len(own) != nodes or any(len(p.cards) != span.per_node for p in own) or old.cordoned:
            raise DomainError(
                "no_room",
                f"{old.name} has no place in place: in place takes its own cards rank for rank, and it holds "
                f"{'; '.join(p.text for p in own)}"
                + (f" (cards {', '.join(map(str, old.cordoned))} cordoned)" if old.cordoned else "")
                + f", not {nodes} node(s) of {span.per_node} card(s) each. Restart it rolling on free whole nodes.",
                status=409,
            )
        places.append(Placement.group(old.name, own, in_place=True))
    return tuple(places)


def _default_cause(chosen: list[Replica], *, named: bool) -> str:
    names = ", ".join(r.name for r in chosen)
    if named:
        return f"asked for by name: {names}"
    revisions = ", ".join(str(n) for n in sorted({r.revision for r in chosen}))
    return f"stale replicas (at revision {revisions}): {names}"


def _busy(op: RestartOperation) -> DomainError:
    return busy_refusal(op, doing="starting another restart of it")


def _check_options(
    *, max_parallel: int, ready_timeout: float, settle_seconds: float | None, stop_at_first_failure: bool
) -> float:
    """Refuse (invalid) a restart's options out of their bounds; returns the settle time it runs with."""
    if (
        isinstance(max_parallel, bool)
        or not isinstance(max_parallel, int)
        or not 1 <= max_parallel <= MAX_PARALLEL
    ):
        raise DomainError(
            "invalid", f"max_parallel must be a whole number from 1 to {MAX_PARALLEL}, not {max_parallel!r}."
        )
    if (
        isinstance(ready_timeout, bool)
        or not isinstance(ready_timeout, int | float)
        or not 0 < ready_timeout <= MAX_READY_TIMEOUT
    ):
        raise DomainError(
            "invalid",
            f"ready_timeout must be a number of seconds above 0 and at most "
            f"{MAX_READY_TIMEOUT:g}, not {ready_timeout!r}.",
        )
    settle = settings.LLMGW_RESTART_SETTLE_SECONDS if settle_seconds is None else settle_seconds
    if (
        isinstance(settle, bool)
        or not isinstance(settle, int | float)
        or not 0 <= settle <= MAX_READY_TIMEOUT
    ):
        raise DomainError(
            "invalid",
            f"settle_seconds must be a number of seconds from 0 to {MAX_READY_TIMEOUT:g}, not {settle!r}.",
        )
    if not isinstance(stop_at_first_failure, bool):
        raise DomainError(
            "invalid", f"stop_at_first_failure must be true or false, not {stop_at_first_failure!r}."
        )
    return settle


def _lock_model(model_name: str) -> ServedModel:
    """The model, locked until the caller's transaction commits; busy while a restart of it is active."""
    # Held until commit: a second restart of the model waits here, then sees this one and is refused.
    model = ServedModel.objects.select_for_update().filter(name=model_name).first()
    if model is None:
        raise not_found(f"No model {model_name!r} in the catalog.")
    active = (
        RestartOperation.objects.filter(model=model, state__in=RestartOperation.ACTIVE_STATES)
        .select_related("model")
        .first()
    )
    if active is not None:
        raise _busy(active)
    return model


def _one_profile(model: ServedModel, chosen: list[Replica]) -> Profile:
    """The one profile the chosen replicas run (several_profiles otherwise)."""
    profile_ids = {r.profile_id for r in chosen}
    if len(profile_ids) > 1:
        raise DomainError(
            "several_profiles",
            f"The replicas named run {len(profile_ids)} different profiles "
            f"of {model.name}: restart one profile's replicas at a time.",
        )
    return Profile.objects.select_related("model", "gpu_class").get(pk=profile_ids.pop())


def _record_operation(op: RestartOperation) -> RestartOperation:
    """Save the operation; busy should another restart of its model be recorded first."""
    try:
        with transaction.atomic():
            op.save()
    except IntegrityError:  # the one-active-restart constraint, should a writer slip past the lock
        raise _busy(
            RestartOperation.objects.filter(model=op.model, state__in=RestartOperation.ACTIVE_STATES).first()
            or op
        ) from None
    return op


def _record_steps(op: RestartOperation, chosen: list[Replica], places: dict[str, Placement]) -> None:
    """One step per chosen replica, each with where the plan puts its replacement."""
    RestartStep.objects.bulk_create(
        RestartStep(
            operation=op,
            old_replica=r,
            planned_node=places[r.name].node if r.name in places else "",
            planned_cards=list(places[r.name].cards) if r.name in places else [],
            planned_in_place=places[r.name].in_place if r.name in places else None,
            planned_ranks=_planned_ranks(places[r.name]) if r.name in places else [],
        )
        for r in chosen
    )


def _planned_ranks(place: Placement) -> list[dict[str, Any]]:
    """Where the plan puts each rank of a replacement across nodes; [] for one on one node (its
    ``node`` and ``cards`` say it)."""
    if len(place.ranks) < 2:
        return []
    return [{"rank": r.rank, "node": r.node, "cards": list(r.cards)} for r in place.ranks]


def _audit_start(op: RestartOperation, names: list[str], *, actor: Actor) -> None:
    audit_record(
        action="restart_start",
        object_type="restart",
        object_key=str(op.pk),
        object_repr=str(op),
        after=_operation_after(op, names),
        actor=actor,
        message=f"restart #{op.pk} of {op.model.name} asked by {op.requested_by_name}: {len(names)} replica(s) "
        f"({', '.join(names)}), {op.mode}, {op.max_parallel} at a time, {op.ready_timeout:g} s to be ready, "
        f"{op.settle_seconds:g} s to stay ready, "
        + ("stopping at the first failed step" if op.stop_at_first_failure else "every replica tried"),
    )


@dataclass(frozen=True)
class RestartPlan:
    """What a restart would do, checked as ``restart_start`` checks it: its replicas and where
    each replacement goes."""

    model: ServedModel
    profile: Profile
    chosen: list[Replica]
    places: dict[str, Placement]


def restart_plan(
    *,
    model_name: str,
    replicas: list[str] | None = None,
    in_place: bool | None = None,
    max_parallel: int = 1,
    avoid_nodes: tuple[str, ...] = (),
    only_nodes: tuple[str, ...] = (),
) -> RestartPlan:
    """Check a restart and play it through, writing nothing: the refusals of ``restart_start``
    (which calls this), or the plan. In the caller's transaction, the model's row locked until it
    ends (a dry run's is its own, and ends at once)."""
    model = _lock_model(model_name)
    chosen = _chosen_replicas(model, replicas)
    profile = _one_profile(model, chosen)
    _check_restartable(model, profile)
    refuse_unless_fits(profile, doing="restarted", model=model)
    places = _plan(
        profile,
        chosen,
        in_place=in_place,
        max_parallel=max_parallel,
        avoid_nodes=avoid_nodes,
        only_nodes=only_nodes,
    )
    return RestartPlan(model=model, profile=profile, chosen=chosen, places=places)


def restart_start(
    *,
    model_name: str,
    replicas: list[str] | None = None,
    in_place: bool | None = None,
    max_parallel: int = 1,
    ready_timeout: float = 600,
    settle_seconds: float | None = None,
    stop_at_first_failure: bool = False,
    actor: Actor | None = None,
    cause: str = "",
    avoid_nodes: tuple[str, ...] = (),
    only_nodes: tuple[str, ...] = (),
) -> RestartOperation:
    """Start restarting ``model_name``'s stale replicas (or the live ones named).

    ``in_place``: True stops each replica before its replacement starts; False
    restarts rolling only (a step without room beside fails); None rolls where
    there is room and goes in place where not. ``settle_seconds``: how long
    each replacement must stay ready before its old replica is stopped
    (LLMGW_RESTART_SETTLE_SECONDS when None). ``stop_at_first_failure``:
    start no new step once one failed (by default every replica is still
    restarted, so one faulty node does not hold the rest back). Creates the operation and its
    steps and audits it; the worker's task is enqueued when the transaction
    commits, so this may run inside a caller's transaction (the resize's).
    The whole restart is played through first (planning/placement.py)
    and each step records where the plan puts its replica; the runner follows
    it. Refusals: not_found, other_model, not_live, nothing_to_restart, busy,
    cpu_only, multi_node (an engine that cannot span the profile's nodes), several_profiles, unknown_engine, invalid, memory
    (the profile does not fit its cards), no_room, no_room_beside (a replica
    has no place).

    ``cause`` says what asked for it in the operators' words (the resize or context change that
    started it, say); by default, the stale replicas or the replicas named. The operation keeps
    it with the profile revision its replacements run. ``avoid_nodes``: nodes no replacement is
    planned on (moving replicas off a node, operations/services/drain.py); ``only_nodes``: the
    only nodes one is (a move to a chosen node).
    """
    settle = _check_options(
        max_parallel=max_parallel,
        ready_timeout=ready_timeout,
        settle_seconds=settle_seconds,
        stop_at_first_failure=stop_at_first_failure,
    )
    actor = actor or current_actor()
    with transaction.atomic():
        plan = restart_plan(
            model_name=model_name,
            replicas=replicas,
            in_place=in_place,
            max_parallel=max_parallel,
            avoid_nodes=avoid_nodes,
            only_nodes=only_nodes,
        )
        model, profile, chosen, places = plan.model, plan.profile, plan.chosen, plan.places
        op = _record_operation(
            RestartOperation(
                model=model,
                profile=profile,
                in_place=in_place,
                max_parallel=max_parallel,
                ready_timeout=float(ready_timeout),
                settle_seconds=float(settle),
                stop_at_first_failure=stop_at_first_failure,
                requested_by=actor.resolved_user,
                requested_by_name=actor.display_name[:150],
                via=actor.via,
                cause=(cause or _default_cause(chosen, named=bool(replicas)))[:300],
                target_revision=profile.revision,
            )
        )
        _record_steps(op, chosen, places)
        _audit_start(op, [r.name for r in chosen], actor=actor)
        # robust: should the enqueue fail, the restart stays queued and the sweep enqueues it.
        transaction.on_commit(partial(enqueue_restart, op.pk), robust=True)
    return op


def operation_cancel(*, operation_id: int, actor: Actor | None = None) -> RestartOperation:
    """Ask a restart to stop: the steps in flight finish, the others are cancelled.

    A queued operation (no worker has it yet) is cancelled at once. Asking
    twice is harmless. Refusals: not_found, finished.
    """
    actor = actor or current_actor()
    with transaction.atomic():
        op = (
            RestartOperation.objects.select_for_update()
            .select_related("model", "profile")
            .filter(pk=operation_id)
            .first()
        )
        if op is None:
            raise not_found(f"No restart operation #{operation_id}.")
        if not op.is_active:
            raise conflict(
                "finished",
                f"Restart #{op.pk} of {op.model.name} has already ended "
                f"({op.state.replace('_', ' ')}): there is nothing to cancel.",
            )
        if op.cancel_requested:
            return op
        before = {"state": op.state, "cancel_requested": False}
        op.cancel_requested = True
        now = timezone.now()
        if op.state == RestartOperation.State.QUEUED:
            op.state, op.finished_at = RestartOperation.State.CANCELLED, now
            op.reason = f"Cancelled by {actor.display_name} before a worker started it."
            op.steps.filter(state=RestartStep.State.PENDING).update(
                state=RestartStep.State.CANCELLED, finished_at=now, reason="cancelled before it started"
            )
        op.save(update_fields=["cancel_requested", "state", "finished_at", "reason"])
        audit_record(
            action="restart_cancel",
            object_type="restart",
            object_key=str(op.pk),
            object_repr=str(op),
            before=before,
            after={"state": op.state, "cancel_requested": True},
            actor=actor,
            message=f"restart #{op.pk} of {op.model.name} (asked by {op.requested_by_name}) cancelled by "
            f"{actor.display_name}"
            + (
                ""
                if op.state == RestartOperation.State.CANCELLED
                else ": the steps in flight finish, no new one starts"
            ),
        )
    return op
