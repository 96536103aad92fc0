"""A run's rolling placements made together, the ones asked while another was being made.

Every placement of the fleet takes the placement lock in turn and holds it to its commit
(``operations/services/placement.py``): its reads, its rows, and its audit entry, which waits there
for the audit chain's lock that every audited write holds to its commit. One placement a
transaction, sixteen steps side by side started a hold apart each, the sixteenth of a wave sixteen
holds after the first (docs/benchmarks.md, "Issue 25, item 4 again"). Here a run's step threads
hand their placements to one queue (``together.py``): the thread that finds none being made makes
every placement queued, its own and those asked while the last batch was made, in one transaction
with the queries of one placement: one hold of the operation's row (the profile, its release, the
foreign-held cards and the hosts each step read before, ``read_first``); one wait for the lock; every plan's cards in one read; a
host's port and the model's replica names read once and counted on (the lock keeps every other
placement out until the commit); the replicas, their cards and their steps each in one write; the
audit entries last, in one insert (the chain's lock held from there to the commit only). Each
placement and its audit entry stay in one transaction, as do those made with it; placements of
other runs and other workers still wait for the lock.

Within a batch the placements are chosen in turn, as one at a time: a plan whose cards an earlier
one of the batch took is refused as a taken card would be, and a best fit (no plan) reads the rows
of those chosen before it, written first. A batch that fails (a name taken by a replica made by
hand meanwhile, the lease lost, an old replica removed) is made again one placement a
transaction, each by its own step's thread, so one that cannot be made fails its own step only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from base.db import update_rows
from catalog.models import Card, Node, Profile, Replica, Shard
from catalog.selectors import release_of
from operations.models import RestartStep
from operations.services.placement import (
    best_fit,
    foreign_held_card_ids,
    free_port,
    node_hosts,
    orphan_cards,
    release_refusal,
    replica_names,
)
from operations.services.runner.records import Records, engine_version, replaced, replica_after
from operations.services.runner.together import BatchFailed
from operations.services.specs import replica_spec


@dataclass(frozen=True)
class FirstReads:
    """What a placement reads before the placement lock: the profile, its release, the cards a
    foreign process holds (the sampler's, not a placement's), and the nodes' hosts."""

    profile: Profile
    release: str
    foreign: set[int]
    hosts: dict[int, str]


def read_first(records: Records, profile: Profile | None = None) -> FirstReads:
    """The reads before the placement lock, by a step's own thread before it hands its placement
    in (``profile``: the one the step read). Read in the batch instead, the leader made them in
    turn while the steps that came meanwhile waited for its batch to end: four round trips of
    every batch's, in the wait of every step between a slot freed and its engine started."""
    if profile is None:
        profile = Profile.objects.select_related("model", "gpu_class").get(pk=records.op.profile_id)
    return FirstReads(profile, release_of(profile), foreign_held_card_ids(), node_hosts())


@dataclass(frozen=True)
class Placing:
    """One rolling step's placement asked: beside its old replica, on the plan's cards when given;
    with what its step read before (``read_first``)."""

    step: RestartStep
    old_spec: dict[str, Any] | None
    planned: tuple[str, list[int]] | None
    first: FirstReads


def place_together(records: Records, asked: list[Placing]) -> list[bool]:
    """Record each placement's replacement in one transaction, in turn; whether each was placed
    (False: no room, or the plan's cards no longer free). More than one and failing: BatchFailed."""
    locked_at: list[float] = []

    @transaction.atomic
    def write() -> list[bool]:
        records.hold()
        # What no placement changes is read before the placement lock, which every placement of
        # the fleet waits for in turn (``FirstReads``), by each step before it handed its placement
        # in: the profile, release and hosts of the first, and a card any of them saw a foreign
        # process hold is held. Whether the cards are still free, the port and the name, after.
        plans = [one.planned for one in asked if one.planned is not None]
        profile, release, hosts = asked[0].first.profile, asked[0].first.release, asked[0].first.hosts
        foreign = set().union(*(one.first.foreign for one in asked))
        records.lock_placement()
        locked_at.append(time.monotonic())
        batch = _Batch(records, profile, hosts)
        free = _free_planned(profile, plans, foreign=foreign)  # every plan's cards, in one read
        placed = []
        for one in asked:
            if one.planned is not None:
                fit = _planned_fit(profile, one.planned, free, taken=batch.taken, release=release)
            else:
                batch.write()  # the best fit reads the cards and the siblings the batch took so far
                fit = best_fit(profile, replacing=one.step.old_replica)
            if fit is not None:
                batch.add(one, *fit)
            placed.append(fit is not None)
        batch.write()
        # The audit entries last, in one insert: the chain's lock, which every audited write of the
        # fleet waits for, is held from here to the commit only, not through the placements.
        records.audit_all(batch.audits)
        return placed

    with records.clock.timed("write: placing replacements (a transaction a batch)"):
        try:
            placed = write()
        except Exception as exc:
            if len(asked) == 1:
                raise
            raise BatchFailed(str(exc)) from exc
        finally:
            if locked_at:  # every other placement waited this long: the lock is held to the commit
                records.clock.add(
                    "hold: the placement lock (a batch of rolling placements, to its commit)",
                    time.monotonic() - locked_at[0],
                )
    records.clock.add("placements made in one transaction (n: transactions)", len(asked), unit="")
    for one, ok in zip(asked, placed, strict=True):
        if ok:
            records.clock.mark(one.step.pk, "placed")
    return placed


class _Batch:
    """A batch's replacements, chosen under the placement lock and written together: their
    replicas in one insert, their cards in another, their steps in one update; their audit entries
    kept for the transaction's end. Ports and names are counted on from one read each."""

    def __init__(self, records: Records, profile: Profile, hosts: dict[int, str]):
        self.records = records
        self.profile = profile
        self.hosts = hosts
        self.names: Iterator[str] | None = None
        self.ports: dict[str, int] = {}  # the last port the batch gave on each host
        self.taken: set[int] = set()  # the cards the batch took
        self.audits: list[dict[str, Any]] = []
        self._pending: list[tuple[Placing, Node, list[Card], int, str]] = []

    def add(self, one: Placing, node: Node, cards: list[Card]) -> None:
        replaced(one.step)  # the old replica still in the catalog, or the step fails (StepFailed)
        if self.names is None:
            self.names = replica_names(self.profile.model)
        self.taken |= {c.pk for c in cards}
        self._pending.append((one, node, cards, _port(node, self.hosts, self.ports), next(self.names)))

    def write(self) -> None:
        if not self._pending:
            return
        profile, records = self.profile, self.records
        made, self._pending = self._pending, []
        news = Replica.objects.bulk_create(
            Replica(
                name=name,
                profile=profile,
                port=port,
                state=Replica.State.STARTING,
                revision=profile.revision,
                engine_version=engine_version(profile, node),
            )
            for _, node, _, port, name in made
        )
        Shard.objects.bulk_create(
            Shard(replica=new, card=c)
            for new, (_, _, cards, _, _) in zip(news, made, strict=True)
            for c in cards
        )
        now = timezone.now()
        for new, (one, node, cards, port, _) in zip(news, made, strict=True):
            step, old, indices = one.step, replaced(one.step), [c.index for c in cards]
            self.audits.append(
                dict(
                    action="start",
                    object_type="replica",
                    object_key=new.name,
                    object_repr=str(new),
                    after=replica_after(new, [str(c) for c in cards]),
                    message=records.said(
                        f"started {new.name} on {node.name} cards {indices} port {port}, "
                        f"revision {profile.revision}, to replace {old.name}"
                    ),
                )
            )
            fields = {
                "new_replica": new,
                "node": node.name,
                "cards": indices,
                "spec": replica_spec(
                    profile, port=port, cards=indices, ready_timeout=records.agent_timeout()
                ),
                "state": RestartStep.State.STARTING,
                "reason": f"starting {new.name} on {node.name} beside {old.name}",
                "started_at": now,
                "old_spec": one.old_spec,
                "in_place": False,
            }
            for name, value in fields.items():
                setattr(step, name, value)
        update_rows(RestartStep, [one.step for one, *_ in made], list(fields))


def _free_planned(
    profile: Profile, plans: list[tuple[str, list[int]]], *, foreign: set[int]
) -> dict[tuple[str, int], Card]:
    """The cards of every plan given that are still free, by node name and index: of the profile's
    class, on a ready node whose agent answers, not cordoned, none held by a foreign process."""
    if not plans:
        return {}
    wanted = Q()
    for node_name, indices in plans:
        wanted |= Q(node__name=node_name, index__in=indices)
    cards = (
        Card.objects.filter(
            wanted,
            node__state=Node.State.READY,
            node__reachable=True,
            gpu_class_id=profile.gpu_class_id,
            shard__isnull=True,
            cordoned=False,
        )
        .exclude(pk__in=foreign)  # a foreign process took one since the plan
        .select_related("node")
    )
    return {(c.node.name, c.index): c for c in cards}


def _planned_fit(
    profile: Profile,
    planned: tuple[str, list[int]],
    free: dict[tuple[str, int], Card],
    *,
    taken: set[int],
    release: str | None,
) -> tuple[Node, list[Card]] | None:
    """The cards the restart's plan gave the step, when they are still free (``free``, and not
    ``taken`` by an earlier placement of the batch) and as many as the profile takes, on a node
    able to run ``release``, the profile's, with no orphan engine on them; None otherwise."""
    node_name, indices = planned
    cards = sorted((free[(node_name, i)] for i in indices if (node_name, i) in free), key=lambda c: c.index)
    if len(cards) != len(indices) or len(cards) != profile.cards or any(c.pk in taken for c in cards):
        return None
    if release_refusal(profile, cards[0].node, release=release) is not None:
        return None  # the node's agent since reported facts the release's floors refuse
    if orphan_cards(cards[0].node) & set(indices):
        return None  # an orphan engine runs there: the best fit stands in
    return cards[0].node, cards


def _port(node: Node, hosts: dict[int, str], given: dict[str, int]) -> int:
    """The node's host's next free port: read the first time in a batch, then one above the last
    the batch gave there (the placement lock keeps every other placement's ports out meanwhile)."""
    host = hosts.get(node.pk, node.agent_host)
    port = given[host] + 1 if host in given else free_port(node, hosts=hosts)
    given[host] = port
    return port
