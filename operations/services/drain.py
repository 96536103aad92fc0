"""Taking a node out of service: cordon it (no new placements), drain it (move each of its live
replicas to other nodes, rolling, as restart operations), uncordon it; and move one replica.

A drain is one restart operation per profile with replicas on the node, each with the node's
replicas named, rolling only (a replacement starts elsewhere and is ready before the old one
stops) and planned off the node: the same checks, plan, progress, deadline and audit as any
restart (operations/services/start.py, runner/). Its replicas are the live ones and the
``unknown`` ones (the node's agent does not answer): those are moved alike, their old cards kept
until the agent confirms their stop. It is all or nothing: when one profile's replicas have no
place elsewhere (or a restart of that model is already under way), or nothing on the node can
be moved, nothing is started and the node is not cordoned; the refusal says why. A drain and a
move can be played through first (``node_drain_plan``, ``replica_move_plan``): where each
replica would go, nothing written. A cordoned node takes no replacement anywhere (placement
uses ready nodes only); the pages show its state on every card grid and node page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from audit.services import audit_record
from base.actor import Actor, current_actor
from base.errors import DomainError, conflict, not_found
from catalog.models import Node, Replica, restartable_replicas_q
from operations.models import RestartOperation
from operations.services.placement import replica_ranks
from operations.services.start import RestartPlan, restart_plan, restart_start


def _node(name: str) -> Node:
    node = Node.objects.select_for_update().filter(name=name).first()
    if node is None:
        raise not_found(f"No node {name!r} in the catalog.")
    return node


def _set_state(node: Node, state: str, *, action: str, message: str, actor: Actor) -> None:
    before = {"state": node.state}
    node.state = state
    node.save(update_fields=["state"])
    audit_record(
        action=action,
        object_type="node",
        object_key=node.name,
        object_repr=str(node),
        before=before,
        after={"state": state},
        message=message,
        actor=actor,
    )


def node_cordon(*, node_name: str, actor: Actor | None = None) -> Node:
    """No new replica is placed on the node; what runs there keeps running. Refused when it is not
    ready (already cordoned, or down)."""
    actor = actor or current_actor()
    with transaction.atomic():
        node = _node(node_name)
        if node.state != Node.State.READY:
            raise conflict(
                "not_ready",
                f"Node {node.name} is {node.state}, not ready: only a ready node is cordoned"
                + (
                    ": it takes no new replica already (uncordon it to take placements again)."
                    if node.state == Node.State.CORDONED
                    else f": it takes no new replica while down. Uncordon {node.name} (back to ready) once its "
                    "agent answers, then cordon it if it should stay out of use."
                ),
            )
        _set_state(
            node,
            Node.State.CORDONED,
            action="cordon",
            message=f"cordoned {node.name}: no new placements",
            actor=actor,
        )
    return node


def node_uncordon(*, node_name: str, actor: Actor | None = None) -> Node:
    """The node takes placements again: a cordoned node, or one marked down (cordon, uncordon and
    drain are the only ways its state changes, so this is the way back). Refused when it is ready."""
    actor = actor or current_actor()
    with transaction.atomic():
        node = _node(node_name)
        if node.state not in (Node.State.CORDONED, Node.State.DOWN):
            raise conflict(
                "not_cordoned", f"Node {node.name} is {node.state}, not cordoned: nothing to uncordon."
            )
        _set_state(
            node,
            Node.State.READY,
            action="uncordon",
            message=f"uncordoned {node.name}: placements again",
            actor=actor,
        )
    return node


@dataclass(frozen=True)
class Move:
    """Where one replica would go: from its node's cards to another's."""

    replica: str
    model: str
    state: str
    from_node: str
    from_cards: list[int]
    to_node: str
    to_cards: list[int]
    # A replica across nodes: every rank's place, now and after ([{"rank", "node", "cards"}], rank 0
    # first, whose node and cards are ``from_node``/``from_cards`` and ``to_node``/``to_cards``); one
    # rank on one node.
    from_ranks: list[dict[str, Any]] = field(default_factory=list)
    to_ranks: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "model": self.model,
            "state": self.state,
            "from_node": self.from_node,
            "from_cards": self.from_cards,
            "to_node": self.to_node,
            "to_cards": self.to_cards,
            "from_ranks": self.from_ranks,
            "to_ranks": self.to_ranks,
        }

    @property
    def text(self) -> str:
        return f"{self.replica} ({self.model}, {self.state}): {_where(self.from_ranks)} → {_where(self.to_ranks)}"


def _where(ranks: list[dict[str, Any]]) -> str:
    """ "gpu-a cards 0, 1", or every rank's place of a replica across nodes."""
    if len(ranks) == 1:
        return f"{ranks[0]['node']} cards {', '.join(map(str, ranks[0]['cards']))}"
    return "; ".join(
        f"rank {r['rank']} on {r['node']} cards {', '.join(map(str, r['cards']))}" for r in ranks
    )


def _moves(plan: RestartPlan) -> list[Move]:
    out = []
    for replica in plan.chosen:
        place = plan.places.get(replica.name)
        ranks = replica_ranks(replica)
        held: list[dict[str, Any]] = [
            {"rank": r, "node": node.name, "cards": cards} for r, node, cards in ranks
        ]
        out.append(
            Move(
                replica=replica.name,
                model=plan.model.name,
                state=replica.state,
                from_node=ranks[0][1].name if ranks else "",
                from_cards=sorted(ranks[0][2]) if ranks else [],
                to_node=place.node if place else "",
                to_cards=list(place.cards) if place else [],
                from_ranks=held,
                to_ranks=[r.as_dict() for r in place.ranks] if place else [],
            )
        )
    return out


def _drained_replicas(node: Node) -> list[list[Replica]]:
    """The node's replicas a drain moves, by profile: live ones, and unknown ones."""
    by_profile: dict[int, list[Replica]] = {}
    for replica in (
        Replica.objects.filter(restartable_replicas_q(), shards__card__node=node)
        .select_related("profile__model")
        .prefetch_related("shards__card__node")
        .distinct()
        .order_by("profile__model__name", "name")
    ):
        by_profile.setdefault(replica.profile_id, []).append(replica)
    return list(by_profile.values())


def _drainable(node: Node) -> list[list[Replica]]:
    """What a drain of ``node`` moves; refused (nothing changed) when it is down or runs nothing."""
    if node.state == Node.State.DOWN:
        raise conflict(
            "node_down",
            f"Node {node.name} is down: its replicas cannot be stopped through its agent. Restart them "
            "elsewhere by name once it answers, or uncordon it (back to ready) first.",
        )
    groups = _drained_replicas(node)
    if not groups:
        stopping = Replica.objects.filter(state=Replica.State.STOPPING, shards__card__node=node).distinct()
        raise conflict(
            "nothing_to_drain",
            f"Node {node.name} runs no replica that can be moved, so no drain was started"
            + (
                f" ({', '.join(r.name for r in stopping)} still wait{'s' if len(stopping) == 1 else ''} for "
                "the agent to confirm a stop)"
                if stopping
                else ""
            )
            + f". Cordon {node.name} to keep new replicas off it.",
        )
    return groups


def node_drain_plan(*, node_name: str, max_parallel: int = 1) -> list[Move]:
    """Play a drain of the node through, writing nothing: where each replica would go, or the
    refusal the drain would meet."""
    with transaction.atomic():
        node = _node(node_name)
        moves = []
        for replicas in _drainable(node):
            plan = restart_plan(
                model_name=replicas[0].profile.model.name,
                replicas=[r.name for r in replicas],
                in_place=False,
                max_parallel=max_parallel,
                avoid_nodes=(node.name,),
            )
            moves += _moves(plan)
        return moves


def node_drain(
    *, node_name: str, max_parallel: int = 1, ready_timeout: float = 600, actor: Actor | None = None
) -> list[RestartOperation]:
    """Cordon the node (unless it is already) and start moving each of its live and unknown
    replicas to other nodes: one rolling restart per profile, planned off the node. The operations
    started, oldest first; refused, with nothing changed, when it runs nothing to move."""
    actor = actor or current_actor()
    with transaction.atomic():
        node = _node(node_name)
        groups = _drainable(node)
        if node.state == Node.State.READY:
            _set_state(
                node,
                Node.State.CORDONED,
                action="cordon",
                message=f"cordoned {node.name} to drain it",
                actor=actor,
            )
        operations = []
        for replicas in groups:
            names = [r.name for r in replicas]
            unknown = [r.name for r in replicas if r.state == Replica.State.UNKNOWN]
            operations.append(
                restart_start(
                    model_name=replicas[0].profile.model.name,
                    replicas=names,
                    in_place=False,
                    max_parallel=max_parallel,
                    ready_timeout=ready_timeout,
                    actor=actor,
                    cause=f"drain of {node.name}: {', '.join(names)}"
                    + (
                        f" ({', '.join(unknown)} unknown: its agent does not answer; "
                        "their cards stay held until it confirms the stop)"
                        if unknown
                        else ""
                    ),
                    avoid_nodes=(node.name,),
                )
            )
    return operations


# --- moving one replica --------------------------------------------------------------------------


def move_targets(replica: Replica) -> list[Node]:
    """The other nodes with cards of the replica's profile's class, by name: where it may be moved
    to (each may still be refused: not ready, not answering, no room)."""
    own = set(replica.shards.values_list("card__node_id", flat=True))
    gpu_class = replica.profile.gpu_class_id
    if gpu_class is None:
        return []
    return list(
        Node.objects.filter(cards__gpu_class_id=gpu_class).exclude(pk__in=own).distinct().order_by("name")
    )


def _move_plan(replica_name: str, to_node: str | None) -> tuple[Replica, list[str], RestartPlan]:
    replica = (
        Replica.objects.select_related("profile__model", "profile__gpu_class")
        .filter(name=replica_name)
        .first()
    )
    if replica is None:
        raise not_found(f"No replica {replica_name!r} in the catalog.")
    nodes = sorted(set(replica.shards.values_list("card__node__name", flat=True)))
    if not replica.is_restartable or not nodes:
        raise DomainError(
            "not_live",
            f"Replica {replica.name} is stopping, not running: there is nothing to move. Its agent has not "
            f"confirmed the stop yet; the reconciler asks again and frees its cards on {', '.join(nodes)} "
            "once it does."
            if replica.state == Replica.State.STOPPING and nodes
            else f"Replica {replica.name} is {replica.state} and holds no cards: there is nothing to move.",
        )
    targets = move_targets(replica)
    kind = replica.profile.gpu_class.name if replica.profile.gpu_class else "GPU"
    if not targets:
        raise conflict(
            "no_other_node",
            f"{replica.name} cannot be moved: {', '.join(nodes)} is the only node with {kind} cards. "
            f"Add a node of that class, or restart {replica.name} where it is.",
        )
    if to_node:
        target = next((n for n in targets if n.name == to_node), None)
        if target is None:
            if to_node in nodes:
                why = f"it is {replica.name}'s own node"
            elif Node.objects.filter(name=to_node).exists():
                why = f"it has no {kind} cards"
            else:
                raise not_found(f"No node {to_node!r} in the catalog.")
            raise conflict(
                "wrong_node",
                f"{replica.name} cannot be moved to {to_node}: {why}. Choose one of "
                f"{', '.join(n.name for n in targets)}.",
            )
        if target.state != Node.State.READY or not target.reachable:
            said = target.state if target.state != Node.State.READY else "not answering"
            raise conflict(
                "not_ready",
                f"{replica.name} cannot be moved to {to_node}: it is {said}, and takes no new replica. "
                "Choose another node, or uncordon it (or wait until its agent answers).",
            )
    try:
        plan = restart_plan(
            model_name=replica.profile.model.name,
            replicas=[replica.name],
            in_place=False,
            avoid_nodes=tuple(nodes),
            only_nodes=(to_node,) if to_node else (),
        )
    except DomainError as err:
        if err.code not in ("no_room", "no_room_beside"):
            raise
        where = to_node or "any other ready node"
        n = replica.profile.cards
        raise conflict(
            "no_room",
            f"{replica.name} cannot be moved: {where} has not {n} {kind} card{'s' if n != 1 else ''} free. "
            f"Free cards on {to_node or 'one of ' + ', '.join(t.name for t in targets)} (move or stop "
            "a replica there), or choose another node.",
        ) from None
    return replica, nodes, plan


def replica_move_plan(*, replica_name: str, to_node: str | None = None) -> Move:
    """Play a move through, writing nothing: where the replica would go, or the refusal."""
    with transaction.atomic():
        _, _, plan = _move_plan(replica_name, to_node)
        return _moves(plan)[0]


def replica_move(
    *,
    replica_name: str,
    to_node: str | None = None,
    ready_timeout: float = 600,
    actor: Actor | None = None,
) -> RestartOperation:
    """Move one live (or unknown) replica off its node, to ``to_node`` or the best fit on another of
    its class: its replacement starts there and is ready before it stops (a rolling restart of
    that replica). Refused, naming why, when no other node of its class exists or has room."""
    actor = actor or current_actor()
    with transaction.atomic():
        replica, nodes, _ = _move_plan(replica_name, to_node)
        return restart_start(
            model_name=replica.profile.model.name,
            replicas=[replica.name],
            in_place=False,
            ready_timeout=ready_timeout,
            actor=actor,
            cause=f"move of {replica.name} off {', '.join(nodes)}" + (f" to {to_node}" if to_node else ""),
            avoid_nodes=tuple(nodes),
            only_nodes=(to_node,) if to_node else (),
        )
