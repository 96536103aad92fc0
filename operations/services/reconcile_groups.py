"""The reconciler's rules for a replica across nodes: the group is one unit.

Each node's listing speaks of the rank that node runs (``Shard.rank``); the replica is live in the
catalog only while every rank is live on its agent:

- a rank its agent no longer runs (failed, stopped, or unknown to it) fails the whole replica: it
  is recorded ``stopping`` with why (``LOST`` and the agent's words), that node's cards freed (its
  agent says nothing runs there), and every other rank stopped on its agent at once, each node's
  cards freed as its agent confirms. Once none is left the replica is ``failed``; a rank whose
  agent does not confirm keeps its cards, and later passes stop it again;
- a replica ``stopping`` (a stop not confirmed on some rank) is stopped again on each node that
  still runs its rank, and that node's cards freed once its agent confirms; the replica ends
  (``stopped``, or ``failed`` when a rank was lost) when its last card is freed;
- a replica ``unknown`` (a node of the group did not answer) takes rank 0's state again only once
  rank 0's agent runs it, every node of the group answers again and each other node's agent runs
  its rank live (asked by rank 0's node's pass); a node that answers without its rank fails the
  group as above.

A node that does not answer makes the group ``unknown`` through the reconciler's own rule (every
live replica holding cards there). Every change is audited as the reconciler's, under the
replica's row lock, and only where the row did not change since the listing was asked and no
restart's step in flight works on it (the runner records it then).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agentclient.client import AgentCallFailed, AgentClient, describe_failure
from audit.services import audit_record, snapshot
from base.actor import Actor
from catalog.models import Node, Replica, Shard
from operations.models import RestartOperation, RestartStep

log = logging.getLogger("operations.reconcile")

# How a group's reason starts once a rank was lost: its end is then ``failed``, not ``stopped``.
LOST = "a rank was lost: "


def is_group(replica: Replica) -> bool:
    """A replica across nodes: it has rank 0's rendezvous port (null on one node), or holds cards as
    a rank > 0. The port too, as a lost group whose other ranks' cards were freed before rank 0's
    stop was confirmed holds rank 0's alone and must still end ``failed``, not as one node would."""
    return replica.rendezvous_port is not None or Shard.objects.filter(replica=replica, rank__gt=0).exists()


def reconcile_group(
    replica: Replica, node: Node, theirs: dict[str, Any] | None, *, actor: Actor, fence: datetime
) -> list[str]:
    """Apply what ``node``'s agent said of its rank of the group ``replica`` (``theirs``: its entry
    in the listing, None when the agent does not know it); one sentence a change."""
    state = str(theirs.get("state")) if theirs else ""
    rank = Shard.objects.filter(replica=replica, card__node=node).values_list("rank", flat=True).first()
    if replica.state == Replica.State.STOPPING:
        if state in Replica.LIVE_STATES and not _stopped(node, replica.name):
            return []
        return _free_rank(
            replica, node, rank, actor=actor, fence=fence, why=f"its agent confirmed rank {rank}'s stop"
        )
    if state in Replica.LIVE_STATES:
        if (
            replica.state == Replica.State.UNKNOWN
            and rank == 0
            and _every_node_answers(replica)
            and _other_ranks_live(replica, node)
        ):
            return _set(
                replica, state, f"every rank's agent answers again ({state})", actor=actor, fence=fence
            )
        return []
    said = describe_failure(theirs, lines=3) if theirs else "its agent does not run it (it does not know it)"
    return _lose(replica, node, rank, f"{LOST}rank {rank} on {node.name}: {said}", actor=actor, fence=fence)


def _stopped(node: Node, name: str, *, drain: float | None = None) -> bool:
    """Its agent stopped ``name`` (or does not run it); ``drain``: how long a ready engine's requests in
    flight may finish first (LLMGW_STOP_DRAIN_SECONDS when None; 0 for a group already lost)."""
    try:
        AgentClient.for_node(node).stop(name, drain=drain)
    except AgentCallFailed as exc:
        log.info("%s is still not stopped on %s: %s", name, node.name, exc.message)
        return False
    return True


def _other_ranks_live(replica: Replica, node: Node) -> bool:
    """Every other node's agent runs its rank of ``replica`` live now: asked, as this pass holds only
    ``node``'s listing (a node that answers again may have lost its rank meanwhile; its own pass
    fails the group then)."""
    for other in Node.objects.filter(cards__shard__replica=replica).exclude(pk=node.pk).distinct():
        try:
            theirs = AgentClient.for_node(other).get(replica.name)
        except AgentCallFailed:
            return False
        if theirs.get("state") not in Replica.LIVE_STATES:
            return False
    return True


def _owned(pk: int) -> bool:
    """A step in flight of an active operation works on the replica: the runner records it (as the
    one-node ``reconcile._set_state`` checks under the row lock)."""
    return (
        RestartStep.objects.filter(
            operation__state__in=RestartOperation.ACTIVE_STATES, state__in=RestartStep.IN_FLIGHT_STATES
        )
        .filter(Q(old_replica_id=pk) | Q(new_replica_id=pk))
        .exists()
    )


def _every_node_answers(replica: Replica) -> bool:
    nodes = Node.objects.filter(cards__shard__replica=replica).distinct()
    return all(n.reachable for n in nodes)


def _lose(
    replica: Replica, node: Node, rank: int | None, reason: str, *, actor: Actor, fence: datetime
) -> list[str]:
    """A rank is gone: the whole replica fails. Recorded stopping with why, this node's cards freed,
    then every other rank stopped on its agent, each node's cards freed once it confirms."""
    changed = _set(replica, Replica.State.STOPPING, reason, actor=actor, fence=fence)
    if not changed:
        return []
    row = Replica.objects.get(pk=replica.pk)
    changed += _free_rank(
        row, node, rank, actor=actor, fence=None, why=f"rank {rank}'s agent does not run it"
    )
    for other in (
        Node.objects.filter(cards__shard__replica=row).exclude(pk=node.pk).distinct().order_by("name")
    ):
        if _stopped(other, row.name, drain=0):  # the group serves nothing without its lost rank
            other_rank = (
                Shard.objects.filter(replica=row, card__node=other).values_list("rank", flat=True).first()
            )
            changed += _free_rank(
                row,
                other,
                other_rank,
                actor=actor,
                fence=None,
                why=f"rank {other_rank} stopped: a rank lost takes the whole replica down",
            )
    return changed


def _set(replica: Replica, state: str, reason: str, *, actor: Actor, fence: datetime) -> list[str]:
    """Set the group's state, unless its row changed since the listing was asked (read again next pass)."""
    with transaction.atomic():
        row = (
            Replica.objects.select_for_update()
            .filter(pk=replica.pk, state=replica.state, state_changed_at__lt=fence)
            .first()
        )
        if row is None or _owned(row.pk):
            return []
        before = snapshot(row)
        row.state, row.reason, row.state_changed_at = state, reason, timezone.now()
        row.save(update_fields=["state", "reason", "state_changed_at"])
        audit_record(
            action="reconcile",
            object_type="replica",
            object_key=row.name,
            object_repr=str(row),
            before=before,
            after=snapshot(row),
            actor=actor,
            message=f"{row.name}: {before['state']} → {state} ({reason})"
            + ("; every other rank is being stopped" if reason.startswith(LOST) else ""),
        )
    return [f"{replica.name}: {replica.state} → {state}"]


def _free_rank(
    replica: Replica, node: Node, rank: int | None, *, actor: Actor, fence: datetime | None, why: str
) -> list[str]:
    """Free the group's cards on ``node`` (its agent says nothing of it runs there), audited; once
    it holds no card, it has ended: ``failed`` when a rank was lost, else ``stopped``."""
    with transaction.atomic():
        rows = Replica.objects.select_for_update().filter(pk=replica.pk, state=Replica.State.STOPPING)
        if fence is not None:
            rows = rows.filter(state_changed_at__lt=fence)
        row = rows.first()
        if row is None or (fence is not None and _owned(row.pk)):
            return []
        shards = Shard.objects.filter(replica=row, card__node=node).select_related("card__node")
        held = [str(s.card) for s in shards]
        if not held:
            return []
        before = {**snapshot(row), "cards": held}
        shards.delete()
        ended = not Shard.objects.filter(replica=row).exists()
        if ended:
            end = Replica.State.FAILED if row.reason.startswith(LOST) else Replica.State.STOPPED
            row.state, row.state_changed_at = end, timezone.now()
            row.save(update_fields=["state", "state_changed_at"])
        audit_record(
            action="reconcile",
            object_type="replica",
            object_key=row.name,
            object_repr=str(row),
            before=before,
            after={**snapshot(row), "cards": []},
            actor=actor,
            message=f"{row.name}: rank {rank} on {node.name}: {why}; cards {', '.join(held)} freed"
            + (f"; every rank is gone: {row.state}" if ended else ""),
        )
    return [f"{replica.name}: rank {rank} on {node.name} freed" + (f", {row.state}" if ended else "")]
