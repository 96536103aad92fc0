"""A run's rolling placements made together, the ones asked while another was being made.

Every placement of the fleet takes the placement lock in turn and holds it to its commit
(``operations/services/placement.py``): its reads, its rows, and its audit entry, which waits there
for the audit chain's lock that every audited write holds to its commit. One placement a
transaction, sixteen steps side by side started a hold apart each, the sixteenth of a wave sixteen
holds after the first (docs/benchmarks.md, "Issue 25, item 4 again"). Here a run's step threads
hand their placements to one queue (``together.py``): the thread that finds none being made makes
every placement queued, its own and those asked while the last batch was made, in one transaction:
one hold of the operation's row, one read of the profile, the foreign-held cards and the hosts
before the lock, one wait for the lock, one for the audit chain's, one commit; a host's port and
the model's replica names are read once a batch and counted on from there (the lock keeps every
other placement out until the commit). Each placement and its audit entry stay in one transaction,
as do those made with it; placements of other runs and other workers still wait for the lock.

Within a batch each placement is made as it would be alone and in turn, so a later one reads the
cards an earlier one took (its rows are the transaction's own): the plan's cards when still free,
or the best fit. A batch that fails (a name taken by a replica made by hand meanwhile, the lease
lost) is made again one placement a transaction, each by its own step's thread, so one that cannot
be made fails its own step only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from catalog.models import Card, Node, Profile
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
from operations.services.runner.records import Records, replaced


@dataclass(frozen=True)
class Placing:
    """One rolling step's placement asked: beside its old replica, on the plan's cards when given."""

    step: RestartStep
    old_spec: dict[str, Any] | None
    planned: tuple[str, list[int]] | None


class BatchFailed(Exception):
    """A batch of more than one placement failed: each is made again alone."""


def place_together(records: Records, asked: list[Placing]) -> list[bool]:
    """Record each placement's replacement in one transaction, in turn; whether each was placed
    (False: no room, or the plan's cards no longer free). More than one and failing: BatchFailed."""
    locked_at: list[float] = []

    @transaction.atomic
    def write() -> list[bool]:
        records.hold()
        # What no placement changes is read before the placement lock, which every placement of
        # the fleet waits for in turn: the profile, its release, the cards a foreign process holds
        # (the sampler's, not a placement's), the nodes' hosts. Whether the cards are still free,
        # the port and the name, after.
        profile = Profile.objects.select_related("model", "gpu_class").get(pk=records.op.profile_id)
        planned = any(one.planned is not None for one in asked)
        foreign = foreign_held_card_ids() if planned else set()
        release = release_of(profile) if planned else None
        hosts = node_hosts()
        records.lock_placement()
        locked_at.append(time.monotonic())
        names = replica_names(profile.model)
        ports: dict[str, int] = {}  # the last port this batch gave on each host
        audits: list[dict[str, Any]] = []
        placed = [
            _place_one(records, one, profile, foreign, release, hosts, ports, names, audits) for one in asked
        ]
        # The audit entries last, in one insert: the chain's lock, which every audited write of the
        # fleet waits for, is held from here to the commit only, not through the placements.
        records.audit_all(audits)
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


def _place_one(
    records: Records,
    one: Placing,
    profile: Profile,
    foreign: set[int],
    release: str | None,
    hosts: dict[int, str],
    ports: dict[str, int],
    names: Iterator[str],
    audits: list[dict[str, Any]],
) -> bool:
    """One placement of a batch, under the placement lock: its cards, its port and its name, recorded."""
    step = one.step
    fit = (
        planned_cards(profile, *one.planned, foreign=foreign, release=release)
        if one.planned is not None
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
        port=_port(node, hosts, ports),
        name=next(names),
        said=lambda new, port: (
            f"started {new} on {node.name} cards {[c.index for c in cards]} port {port}, "
            f"revision {profile.revision}, to replace {old.name}"
        ),
        reason=lambda new: f"starting {new} on {node.name} beside {old.name}",
        started_at=timezone.now(),
        old_spec=one.old_spec,
        in_place=False,
        locked=True,
        audits=audits,
    )
    return True


def _port(node: Node, hosts: dict[int, str], given: dict[str, int]) -> int:
    """The node's host's next free port: read the first time in a batch, then one above the last
    the batch gave there (the placement lock keeps every other placement's ports out meanwhile)."""
    host = hosts.get(node.pk, node.agent_host)
    port = given[host] + 1 if host in given else free_port(node, hosts=hosts)
    given[host] = port
    return port


def planned_cards(
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
