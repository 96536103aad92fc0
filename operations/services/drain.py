"""Taking a node out of service: cordon it (no new placements), drain it (move each of its live
replicas to other nodes, rolling, as restart operations), uncordon it; and move one replica.

A drain is one restart operation per profile with replicas on the node, each with the node's
replicas named, rolling only (a replacement starts elsewhere and is ready before the old one
stops) and planned off the node: the same checks, plan, progress, deadline and audit as any
restart (operations/services/start.py, runner/). It is all or nothing: when one profile's
replicas have no place elsewhere (or a restart of that model is already under way), nothing is
started and the node is not cordoned. A cordoned node takes no replacement anywhere (placement
uses ready nodes only); the pages show its state on every card grid and node page.
"""

from __future__ import annotations

from django.db import transaction

from audit.services import audit_record
from base.actor import Actor, current_actor
from base.errors import DomainError, conflict, not_found
from catalog.models import Node, Replica, live_replicas_q
from operations.models import RestartOperation
from operations.services.start import restart_start


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
                + (" (uncordon it to take placements again)." if node.state == Node.State.CORDONED else "."),
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


def node_drain(
    *, node_name: str, max_parallel: int = 1, ready_timeout: float = 600, actor: Actor | None = None
) -> list[RestartOperation]:
    """Cordon the node (unless it is already) and start moving each of its live replicas to other
    nodes: one rolling restart per profile, planned off the node. The operations started, oldest
    first (none when the node runs nothing: it is then only cordoned)."""
    actor = actor or current_actor()
    with transaction.atomic():
        node = _node(node_name)
        if node.state == Node.State.DOWN:
            raise conflict(
                "node_down",
                f"Node {node.name} is down: its replicas cannot be stopped through its agent. Restart them "
                "elsewhere by name once it answers, or uncordon it (back to ready) first.",
            )
        if node.state == Node.State.READY:
            _set_state(
                node,
                Node.State.CORDONED,
                action="cordon",
                message=f"cordoned {node.name} to drain it",
                actor=actor,
            )
        by_profile: dict[int, list[Replica]] = {}
        for replica in (
            Replica.objects.filter(live_replicas_q(), shards__card__node=node)
            .select_related("profile__model")
            .distinct()
            .order_by("profile__model__name", "name")
        ):
            by_profile.setdefault(replica.profile_id, []).append(replica)
        operations = []
        for replicas in by_profile.values():
            names = [r.name for r in replicas]
            operations.append(
                restart_start(
                    model_name=replicas[0].profile.model.name,
                    replicas=names,
                    in_place=False,
                    max_parallel=max_parallel,
                    ready_timeout=ready_timeout,
                    actor=actor,
                    cause=f"drain of {node.name}: {', '.join(names)}",
                    avoid_nodes=(node.name,),
                )
            )
    return operations


def replica_move(
    *, replica_name: str, ready_timeout: float = 600, actor: Actor | None = None
) -> RestartOperation:
    """Move one live replica off its node: its replacement starts on another node and is ready
    before it stops (a rolling restart of that replica, planned off its node)."""
    actor = actor or current_actor()
    replica = Replica.objects.select_related("profile__model").filter(name=replica_name).first()
    if replica is None:
        raise not_found(f"No replica {replica_name!r} in the catalog.")
    nodes = sorted(set(replica.shards.values_list("card__node__name", flat=True)))
    if not replica.is_live or not nodes:
        raise DomainError(
            "not_live",
            f"Replica {replica.name} is {replica.state} and holds no cards: there is nothing to move.",
        )
    return restart_start(
        model_name=replica.profile.model.name,
        replicas=[replica.name],
        in_place=False,
        ready_timeout=ready_timeout,
        actor=actor,
        cause=f"move of {replica.name} off {', '.join(nodes)}",
        avoid_nodes=tuple(nodes),
    )
