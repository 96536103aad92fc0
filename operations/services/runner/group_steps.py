"""A step whose replica or replacement spans nodes: where its replacement goes and how it is
recorded, rank by rank.

Rolling (where a whole group has room): the replacement's every rank is placed on free cards of
ready nodes of one fabric domain, class and release (the restart's plan first, else the group's
best fit, ``operations/services/placement.py``), with one serving port and one rendezvous port
each free on every host the group touches (docs/design.md, "Replicas across nodes"); it is
recorded with a shard per card naming its rank and a spec per rank naming rank 0's address and
the rendezvous port; then started, readied and settled as one unit (``groups.py``) before the
old replica is stopped. In place (asked for, or no room beside): every rank of the old replica
is stopped first, and the replacement starts on the very same cards of the same nodes, rank for
rank, with its ports; a replacement of another shape than the old replica's is not restarted in
place (its cards are not the old one's), and the step says so.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from catalog.models import Card, Node, Profile, Replica, Shard
from operations.models import RestartStep
from operations.services.placement import (
    foreign_held_card_ids,
    group_best_fit,
    group_ports,
    node_hosts,
    orphan_cards,
    release_refusal,
    replica_name,
    replica_placement,
)
from operations.services.runner.groups import RankRecord, replica_ranks, said_ranks, spans
from operations.services.runner.parts import RunParts
from operations.services.runner.records import replaced, replica_after
from operations.services.specs import rank_specs, running_ranks

Fit = list[tuple[int, Node, list[Card]]]


def is_group_step(
    profile: Profile, old: Replica, *, ranks: list[tuple[int, Node, list[int]]] | None = None
) -> bool:
    """The step's replacement spans nodes (its profile's ``nodes`` > 1), or its old replica does
    (read from ``ranks``, its ``replica_ranks``, when given)."""
    if max(profile.nodes, 1) > 1:
        return True
    return any(rank > 0 for rank, _, _ in ranks) if ranks is not None else spans(old)


def old_ranks(run: RunParts, old: Replica) -> list[RankRecord]:
    """The old replica's ranks with the spec each runs (``specs.running_ranks``); a rank whose spec
    is not known has none (an in-place step that fails then cannot start it again, and says so)."""
    return running_ranks(old, ready_timeout=run.records.agent_timeout())


def place_group(run: RunParts, step: RestartStep, *, planned: list[dict[str, Any]] | None = None) -> bool:
    """Record the replacement, every rank on free cards beside the old replica: where the
    restart's plan put each rank when ``planned`` (and its cards are still free on ready nodes),
    else the group's best fit; False when no whole group has room."""
    records = run.records

    @transaction.atomic
    def write() -> bool:
        records.hold()
        profile = Profile.objects.select_related("model", "gpu_class").get(pk=records.op.profile_id)
        hosts = node_hosts()
        records.lock_placement()
        fit = _planned_fit(profile, planned) if planned else None
        if fit is None and not planned:
            fit = _best_fit(profile, replaced(step))
        if fit is None:
            return False
        port, rendezvous = group_ports([node for _, node, _ in fit], hosts=hosts)
        old = replaced(step)
        record_group_replacement(
            run,
            step,
            profile,
            fit,
            port=port,
            rendezvous_port=rendezvous,
            said=f"to replace {old.name}",
            started_at=timezone.now(),
            in_place=False,
        )
        return True

    with records.clock.timed("write: placing a group (transaction)"):
        placed = write()
    if placed:
        records.clock.mark(step.pk, "placed")
    return placed


def _best_fit(profile: Profile, old: Replica) -> Fit | None:
    found = group_best_fit(profile, replacing=old)
    return [(rank, node, list(cards)) for rank, node, cards in found] if found else None


def _planned_fit(profile: Profile, planned: list[dict[str, Any]]) -> Fit | None:
    """The cards the restart's plan gave each rank, when every one is still free (not cordoned, held
    by no foreign process or orphan engine, as ``placing.planned_cards`` asks) on a ready node whose
    agent answers and whose release floors pass; None otherwise."""
    fit: Fit = []
    per_rank = profile.cards // max(profile.nodes, 1)
    foreign = foreign_held_card_ids()
    for place in sorted(planned, key=lambda p: int(p["rank"])):
        cards = list(
            Card.objects.filter(
                node__name=place["node"],
                node__state=Node.State.READY,
                node__reachable=True,
                gpu_class_id=profile.gpu_class_id,
                shard__isnull=True,
                cordoned=False,
                index__in=list(place["cards"]),
            )
            .exclude(pk__in=foreign)  # a foreign process took one since the plan
            .select_related("node")
            .order_by("index")
        )
        if len(cards) != len(place["cards"]) or len(cards) != per_rank:
            return None
        if release_refusal(profile, cards[0].node) is not None:
            return None
        if orphan_cards(cards[0].node) & set(place["cards"]):
            return None  # an orphan engine runs there: the best fit stands in
        fit.append((int(place["rank"]), cards[0].node, cards))
    return fit if len(fit) == max(profile.nodes, 1) else None


def record_group_replacement(
    run: RunParts,
    step: RestartStep,
    profile: Profile,
    fit: Fit,
    *,
    port: int,
    rendezvous_port: int,
    said: str,
    **fields: Any,
) -> Replica:
    """In the caller's transaction: the replacement recorded with a shard per card naming its rank,
    its serving port and rank 0's rendezvous port, audited; the step set starting with each rank's
    place and spec (``ranks``), rank 0's node, cards and spec in ``node``, ``cards`` and ``spec``."""
    records = run.records
    fit = sorted(fit, key=lambda f: f[0])
    specs = rank_specs(
        profile,
        [(rank, node, [c.index for c in cards]) for rank, node, cards in fit],
        port=port,
        rendezvous_port=rendezvous_port,
        ready_timeout=records.agent_timeout(),
    )
    head = fit[0][1]
    new = Replica.objects.create(
        name=replica_name(profile.model, step),
        profile=profile,
        port=port,
        rendezvous_port=rendezvous_port,
        state=Replica.State.STARTING,
        revision=profile.revision,
        engine_version=str((head.engines or {}).get(profile.engine, ""))
        if isinstance(head.engines, dict)
        else "",
    )
    Shard.objects.bulk_create(Shard(replica=new, card=c, rank=rank) for rank, _, cards in fit for c in cards)
    ranks: list[RankRecord] = [
        {
            "rank": rank,
            "node": node.name,
            "cards": [c.index for c in cards],
            "spec": specs[rank],
            "state": "",
            "reason": "",
            "sent": False,
        }
        for rank, node, cards in fit
    ]
    where = said_ranks(ranks)
    records.audit(
        action="start",
        object_type="replica",
        object_key=new.name,
        object_repr=str(new),
        after={**replica_after(new, [str(c) for _, _, cards in fit for c in cards]), "ranks": where},
        message=records.said(
            f"started {new.name} across {len(fit)} nodes ({where}), port {port}, rendezvous port "
            f"{rendezvous_port} on {head.agent_host}, revision {profile.revision}, {said}"
        ),
    )
    fields |= {
        "new_replica": new,
        "node": head.name,
        "cards": [c.index for c in fit[0][2]],
        "spec": specs[0],
        "ranks": ranks,
        "state": RestartStep.State.STARTING,
        "reason": f"starting {new.name}'s {len(fit)} ranks: {where}",
    }
    RestartStep.objects.filter(pk=step.pk).update(**fields)
    for name, value in fields.items():
        setattr(step, name, value)
    return new


def in_place_refusal(profile: Profile, old: Replica) -> str:
    """Why a group step cannot go in place ('' when it can): in place, the replacement takes the old
    replica's very cards rank for rank, so it must have the old one's shape, none of those cards
    cordoned, and every node must run the release."""
    ranks = replica_ranks(old)
    per_rank = profile.cards // max(profile.nodes, 1)
    if len(ranks) != max(profile.nodes, 1) or any(len(cards) != per_rank for _, _, cards in ranks):
        return (
            f"In place is refused: {old.name} holds {said_ranks(ranks) or 'no cards'}, and its replacement needs "
            f"{max(profile.nodes, 1)} node(s) of {per_rank} card(s) each; in place takes the old replica's own "
            "cards rank for rank. Free whole nodes of its class for a rolling restart."
        )
    for _, node_name, cards in ranks:
        node = Node.objects.get(name=node_name)
        cordoned = list(
            Card.objects.filter(node=node, index__in=cards, cordoned=True).values_list("index", flat=True)
        )
        if cordoned:
            return (
                f"In place is refused: card(s) {', '.join(map(str, cordoned))} of {node_name} are cordoned, and "
                f"in place takes {old.name}'s own cards rank for rank. Uncordon them if they are sound, or free "
                "whole nodes for a rolling restart."
            )
        refusal = release_refusal(profile, node)
        if refusal is not None:
            return f"In place on {node_name} is refused: {refusal.message}"
    return ""


def swap_group(run: RunParts, step: RestartStep, current: Replica, reason: str) -> Replica | None:
    """In the caller's transaction, ``current`` locked and its stop confirmed by every agent: it is
    recorded stopped with its cards freed, and the new group recorded where the restart's plan put
    it in place, else on the old group's very cards rank for rank (with its ports when the places
    are the old ones, else ports free on every host of the new group); None when another replica
    took one of those cards meanwhile."""
    records = run.records
    profile = Profile.objects.select_related("model").get(pk=records.op.profile_id)
    old = [(int(r["rank"]), r["node"], list(r["cards"])) for r in step.old_ranks]
    planned = [(int(r["rank"]), r["node"], list(r["cards"])) for r in step.planned_ranks]
    places = planned if step.planned_in_place and planned else old
    for _, node_name, cards in places:
        if (
            Shard.objects.filter(card__node__name=node_name, card__index__in=cards)
            .exclude(replica=current)
            .exists()
        ):
            return None
    nodes = {n.name: n for n in Node.objects.filter(name__in=[p[1] for p in places])}
    fit: Fit = [
        (rank, nodes[node], list(Card.objects.filter(node=nodes[node], index__in=cards).order_by("index")))
        for rank, node, cards in places
    ]
    if current.state in Replica.HOLDING_STATES:
        held_node, held_cards = replica_placement(current)
        if held_node is not None:
            every = [str(s.card) for s in Shard.objects.filter(replica=current).select_related("card__node")]
            records.stop_for_in_place(current, held_node, held_cards, reason=reason, held=every)
    same = places == old and current.rendezvous_port is not None
    port, rendezvous = (
        (current.port, current.rendezvous_port or 0) if same else group_ports(list(nodes.values()))
    )
    return record_group_replacement(
        run,
        step,
        profile,
        fit,
        port=port,
        rendezvous_port=rendezvous,
        said=f"in place of {current.name}",
    )
