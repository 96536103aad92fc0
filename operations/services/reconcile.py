"""The reconciler: the catalog kept in line with what each node's agent runs.

A pass (``reconcile``, the workers' periodic task ``reconcile_fleet``, or
``python manage.py reconcile``) asks every node's agent for its replicas
(``GET /v1/replicas``), in parallel (``LLMGW_RECONCILE_PARALLEL`` at once) and
each within its own short ``LLMGW_RECONCILE_AGENT_TIMEOUT_SECONDS``, and brings
the catalog in line with each node as its answer comes (a hung agent delays no
other node), each change audited as the reconciler's:

- a replica the catalog holds as live that the agent no longer runs (failed,
  stopped, or unknown to it) becomes failed, with the agent's reason and exit
  code, and its cards are freed: the agent says nothing runs on them;
- a replica whose stop was not confirmed (``stopping``) is asked to stop
  again; once the agent confirms it, it is stopped and its cards are freed;
- a replica ``unknown`` (its node did not answer) takes the state the agent
  reports again, or failed when the agent no longer runs it;
- engines the agent runs that the catalog does not hold are listed on the
  node as orphans, for an operator to adopt or stop (they may hold cards the
  catalog thinks free: the agent is the truth of what runs);
- what the agent says of its node (``GET /v1/node``: driver, CUDA, architecture, the engines installed
  with their releases) is kept on the node when it changed, audited; the release floors and a
  profile's release are checked against it (planning/releases.py). An agent that cannot say
  (older than these facts, or its node answer failing) leaves what was known as it was;
- a node whose agent does not answer (down, slow, a refused token) is marked
  unreachable with the reason, keeping when it was last seen; its live
  replicas become ``unknown``, not ready. Placement passes over it;
- a replica across nodes is one unit: a rank missing or failed on its agent fails the whole
  replica and every other rank is stopped (``reconcile_groups.py``).

A listing is applied only to what it can speak of: a replica whose state
changed after its agent was asked (``Replica.state_changed_at`` later than
the listing's time, less ``LLMGW_RECONCILE_CLOCK_MARGIN_SECONDS`` for the
workers' clocks) is left
for the next pass, checked again under the replica's row lock as it is
written; so a restart that starts, finishes or stops a replica while a pass
is under way is not undone by an older listing. A card is freed only when the
listing shows no engine on it. Replicas an operation in flight owns (a
step's replacement, or the old replica it stops or restores) are left to the
runner, which records them as it goes. When an agent last answered is a reading, not a change: it is kept
in ``operations.AgentContact``, outside the catalog, and written without an
audit entry; whether a node is reachable, its orphans and every replica's
state are changes to the catalog, and audited.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentclient.client import AgentCallFailed, AgentClient, describe_failure
from audit.services import audit_record, snapshot
from base.actor import Actor
from base.secrets import profile_secrets
from catalog.models import Node, Replica, Shard
from operations.models import AgentContact, RestartOperation, RestartStep
from operations.services.reconcile_groups import is_group, reconcile_group

log = logging.getLogger("operations.reconcile")

RECONCILER = "reconciler"


def reconciler_actor() -> Actor:
    return Actor(via="worker", name=RECONCILER, request_id=f"reconcile-{uuid.uuid4().hex[:12]}")


@dataclass
class NodeReport:
    node: str
    reachable: bool
    reason: str = ""
    changed: list[str] = field(default_factory=list)  # one sentence a change
    orphans: list[str] = field(default_factory=list)


@dataclass
class Report:
    nodes: list[NodeReport] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "nodes": len(self.nodes),
            "unreachable": [n.node for n in self.nodes if not n.reachable],
            "changes": [c for n in self.nodes for c in n.changed],
            "orphans": {n.node: n.orphans for n in self.nodes if n.orphans},
        }


# --- node reachability: also what the runner calls when an agent refuses the connection ------------


def node_unreachable(node: Node, *, reason: str, actor: Actor) -> bool:
    """Mark the node's agent unreachable (audited), with why; False when it already was (the first
    reason is kept)."""
    with transaction.atomic():
        row = Node.objects.select_for_update().get(pk=node.pk)
        if not row.reachable:
            return False
        before = {"reachable": row.reachable, "unreachable_reason": row.unreachable_reason}
        row.reachable, row.unreachable_reason = False, reason
        row.save(update_fields=["reachable", "unreachable_reason"])
        seen = f"{row.last_seen_at:%Y-%m-%d %H:%M:%S} UTC" if row.last_seen_at else "never"
        audit_record(
            action="unreachable",
            object_type="node",
            object_key=row.name,
            object_repr=str(row),
            before=before,
            after={"reachable": False, "unreachable_reason": reason},
            actor=actor,
            message=f"node {row.name}'s agent does not answer (last seen {seen}): {reason}",
        )
    return True


def _node_reachable(node: Node, actor: Actor) -> bool:
    """Its agent answered: last seen now (a reading, not audited), and reachable again (audited) if it
    was not. True when it was not."""
    AgentContact.objects.update_or_create(node_id=node.pk, defaults={"last_seen_at": timezone.now()})
    with transaction.atomic():
        row = Node.objects.select_for_update().get(pk=node.pk)
        was = row.reachable
        if not was:
            row.reachable, row.unreachable_reason = True, ""
            row.save(update_fields=["reachable", "unreachable_reason"])
            audit_record(
                action="reachable",
                object_type="node",
                object_key=row.name,
                object_repr=str(row),
                before={"reachable": False, "unreachable_reason": node.unreachable_reason},
                after={"reachable": True},
                actor=actor,
                message=f"node {row.name}'s agent answers again",
            )
    return not was


# --- a pass --------------------------------------------------------------------------------------


def _owned_by_operations() -> set[int]:
    """Replicas a step in flight of an active operation is working on: the runner records those."""
    steps = RestartStep.objects.filter(
        operation__state__in=RestartOperation.ACTIVE_STATES, state__in=RestartStep.IN_FLIGHT_STATES
    ).values_list("old_replica_id", "new_replica_id")
    return {pk for pair in steps for pk in pair if pk is not None}


def _secrets_by_node(nodes: list[Node]) -> dict[int, tuple[str, ...]]:
    """The secret values of the profiles whose replicas hold cards on each of ``nodes``: what an
    agent's answer about them is redacted of (its reasons and log tails become replicas' reasons)."""
    out: dict[int, set[str]] = {}
    rows = Shard.objects.filter(card__node__in=nodes).values_list(
        "card__node_id", "replica__profile__engine", "replica__profile__env"
    )
    for node_id, engine, env in rows:
        out.setdefault(node_id, set()).update(profile_secrets(engine, env or {}))
    return {node_id: tuple(sorted(values)) for node_id, values in out.items()}


@dataclass
class Listing:
    """What one node's agent said of its replicas (or why it did not), and when it was asked: it
    speaks of nothing that changed after that."""

    node: Node
    asked_at: datetime
    answer: list[dict[str, Any]] | AgentCallFailed
    facts: dict[str, Any] | None = None  # what the agent says of its node (FACTS), asked after its list

    @property
    def fence(self) -> datetime:
        """Rows whose state changed at or after this are not judged by this listing."""
        # A change recorded this close before the listing may come from a worker whose clock is a
        # little ahead: it waits for the next pass, as one after the listing does.
        return self.asked_at - timedelta(seconds=settings.LLMGW_RECONCILE_CLOCK_MARGIN_SECONDS)


def _ask(node: Node, secrets: tuple[str, ...] = ()) -> Listing:
    asked_at = timezone.now()
    agent = AgentClient.for_node(
        node, timeout=settings.LLMGW_RECONCILE_AGENT_TIMEOUT_SECONDS, secrets=secrets
    )
    try:
        answer = agent.replicas()
    except AgentCallFailed as exc:
        return Listing(node, asked_at, exc)
    if not isinstance(answer, list):
        return Listing(
            node,
            asked_at,
            AgentCallFailed(
                "agent_bad_answer",
                f"The agent of node {node.name} answered its replica list with something else.",
            ),
        )
    return Listing(
        node,
        asked_at,
        [r for r in answer if isinstance(r, dict) and isinstance(r.get("id"), str)],
        _ask_facts(node, agent),
    )


def reconcile(
    *,
    nodes: list[Node] | None = None,
    actor: Actor | None = None,
    before_apply: Callable[[Listing], None] | None = None,
) -> Report:
    """One pass over ``nodes`` (every node): ask their agents in parallel, and bring the catalog in
    line with each node as its agent's answer comes. ``before_apply`` is called with each listing
    just before it is applied (a seam: the tests hold a pass there while a restart goes on)."""
    actor = actor or reconciler_actor()
    nodes = list(Node.objects.order_by("name")) if nodes is None else nodes
    report = Report()
    if not nodes:
        return report
    secrets = _secrets_by_node(nodes)
    # Only the agents are asked in threads: the database is written from this thread alone.
    with ThreadPoolExecutor(
        max_workers=min(settings.LLMGW_RECONCILE_PARALLEL, len(nodes)), thread_name_prefix="reconcile"
    ) as pool:
        asked = [pool.submit(_ask, node, secrets.get(node.pk, ())) for node in nodes]
        for done in as_completed(asked):
            listing = done.result()
            try:
                if before_apply is not None:
                    before_apply(listing)
                out = _reconcile_node(listing, actor)
                if listing.facts is not None:
                    set_node_facts(listing.node, listing.facts, actor, out)
                report.nodes.append(out)
            except Exception:  # one node's trouble does not keep the others out of line
                log.exception("reconciling node %s failed", listing.node.name)
    report.nodes.sort(key=lambda n: n.node)
    return report


FACTS = ("driver_version", "cuda_version", "arch", "engines")


def _ask_facts(node: Node, agent: AgentClient) -> dict[str, Any] | None:
    """What the node's agent says of its node; None when it cannot say (an older agent, a failure)."""
    try:
        info = agent.node_info()
    except AgentCallFailed as exc:
        log.info("node %s's agent did not say its facts: %s", node.name, exc.message)
        return None
    return {key: info[key] for key in FACTS} if info.get("facts") else None


def set_node_facts(node: Node, facts: dict[str, Any], actor: Actor, out: NodeReport | None = None) -> bool:
    """Keep what the node's agent said of its node (``FACTS``) when it differs from what the catalog
    holds, audited as a change of the node; False when nothing changed."""
    with transaction.atomic():
        row = Node.objects.select_for_update().get(pk=node.pk)
        before = {key: getattr(row, key) for key in FACTS}
        if row.facts_at is not None and before == facts:
            return False
        for key in FACTS:
            setattr(row, key, facts[key])
        row.facts_at = timezone.now()
        row.save(update_fields=[*FACTS, "facts_at"])
        engines = ", ".join(f"{k} {v}" for k, v in sorted(facts["engines"].items())) or "no engine"
        audit_record(
            action="facts",
            object_type="node",
            object_key=row.name,
            object_repr=str(row),
            before=before if node.facts_at is not None else {},
            after=facts,
            actor=actor,
            message=f"node {row.name}'s agent reports driver {facts['driver_version'] or 'unknown'}, CUDA "
            f"{facts['cuda_version'] or 'unknown'}, {facts['arch'] or 'architecture unknown'}; installed: {engines}",
        )
    if out is not None:
        out.changed.append(f"node {node.name} facts: {', '.join(k for k in FACTS if before[k] != facts[k])}")
    return True


def _cards_in_use(answer: list[dict[str, Any]], but: str) -> set[int]:
    """The cards the agent's listing shows an engine other than ``but`` live on."""
    return {
        int(card)
        for r in answer
        if r["id"] != but and r.get("state") in Replica.LIVE_STATES
        for card in (r.get("cards") or [])
        if isinstance(card, int)
    }


def _reconcile_node(listing: Listing, actor: Actor) -> NodeReport:
    node, answer, fence = listing.node, listing.answer, listing.fence
    owned = _owned_by_operations()
    on_node = list(
        Replica.objects.filter(
            state__in=Replica.HOLDING_STATES, shards__card__node=node, state_changed_at__lt=fence
        )
        .exclude(pk__in=owned)
        .distinct()
        .order_by("name")
    )
    if isinstance(answer, AgentCallFailed):
        out = NodeReport(node=node.name, reachable=False, reason=answer.message)
        if node_unreachable(node, reason=answer.message, actor=actor):
            out.changed.append(f"node {node.name} unreachable: {answer.message}")
        for replica in on_node:
            if replica.is_live:
                _set_state(
                    replica,
                    Replica.State.UNKNOWN,
                    release=False,
                    reason=f"its node's agent does not answer: {answer.message}",
                    actor=actor,
                    out=out,
                    fence=fence,
                )
        return out

    out = NodeReport(node=node.name, reachable=True)
    if _node_reachable(node, actor):
        out.changed.append(f"node {node.name} reachable again")
    running = {r["id"]: r for r in answer}
    for replica in on_node:
        theirs = running.get(replica.name)
        state = str(theirs.get("state")) if theirs else ""
        if is_group(replica):  # a replica across nodes: one unit (reconcile_groups.py)
            out.changed += reconcile_group(replica, node, theirs, actor=actor, fence=fence)
            continue
        if replica.state == Replica.State.STOPPING:
            if state in Replica.LIVE_STATES:
                try:
                    AgentClient.for_node(node).stop(replica.name)
                except AgentCallFailed as exc:
                    log.info("%s is still not stopped on %s: %s", replica.name, node.name, exc.message)
                    continue
            _set_state(
                replica,
                Replica.State.STOPPED,
                release=True,
                reason="its agent confirmed the stop",
                actor=actor,
                out=out,
                fence=fence,
                in_use=_cards_in_use(answer, but=replica.name),
            )
        elif state in Replica.LIVE_STATES:
            if replica.state == Replica.State.UNKNOWN:
                _set_state(
                    replica,
                    state,
                    release=False,
                    reason="its agent answers again",
                    actor=actor,
                    out=out,
                    fence=fence,
                )
        else:
            said = (
                describe_failure(theirs, lines=3)
                if theirs
                else "the agent does not run it (it does not know it)"
            )
            _set_state(
                replica,
                Replica.State.FAILED,
                release=True,
                reason=said,
                actor=actor,
                out=out,
                fence=fence,
                in_use=_cards_in_use(answer, but=replica.name),
            )
    held = set(
        Replica.objects.filter(state__in=Replica.HOLDING_STATES, shards__card__node=node).values_list(
            "name", flat=True
        )
    ) | set(Replica.objects.filter(pk__in=owned).values_list("name", flat=True))
    # One the catalog started or stopped since the listing is not judged by it.
    held |= set(
        Replica.objects.filter(name__in=[r["id"] for r in answer], state_changed_at__gte=fence).values_list(
            "name", flat=True
        )
    )
    orphans = [
        {
            "id": r["id"],
            "state": r.get("state"),
            "port": r.get("port"),
            "cards": r.get("cards"),
            "pid": r.get("pid"),
        }
        for r in answer
        if r.get("state") in Replica.LIVE_STATES and r["id"] not in held
    ]
    out.orphans = [o["id"] for o in orphans]
    _set_orphans(node, orphans, actor, out)
    return out


def _set_state(
    replica: Replica,
    state: str,
    *,
    release: bool,
    reason: str,
    actor: Actor,
    out: NodeReport,
    fence: datetime,
    in_use: set[int] = frozenset(),  # type: ignore[assignment]
) -> None:
    """Set what the listing says, unless the row changed since the listing was asked for (a runner,
    an operator, checked under its row lock): it is then read again next pass. With ``release``,
    its cards are freed, unless the listing shows another engine on one of them: it is then left
    as it is, said in the report, for an operator to look at."""
    with transaction.atomic():
        row = (
            Replica.objects.select_for_update()
            .filter(pk=replica.pk, state=replica.state, state_changed_at__lt=fence)
            .first()
        )
        if row is None or _owned_by_operations() & {row.pk}:
            return  # changed meanwhile (a runner, an operator): read again next pass
        if release and in_use:
            busy = Shard.objects.filter(replica=row, card__index__in=in_use).select_related("card__node")
            if busy:
                out.changed.append(
                    f"{row.name}: not freed: its agent runs another engine on "
                    f"{', '.join(str(s.card) for s in busy)}"
                )
                return
        shards = Shard.objects.filter(replica=row).select_related("card__node")
        held = [str(s.card) for s in shards]
        before = {**snapshot(row), "cards": held}
        row.state, row.reason, row.state_changed_at = state, reason, timezone.now()
        row.save(update_fields=["state", "reason", "state_changed_at"])
        if release:
            shards.delete()
        audit_record(
            action="reconcile",
            object_type="replica",
            object_key=row.name,
            object_repr=str(row),
            before=before,
            after={**snapshot(row), "cards": [] if release else held},
            actor=actor,
            message=f"{row.name}: {before['state']} → {state} ({reason})"
            + (f"; cards {', '.join(held)} freed" if release and held else ""),
        )
    out.changed.append(f"{replica.name}: {replica.state} → {state}")


def _set_orphans(node: Node, orphans: list[dict[str, Any]], actor: Actor, out: NodeReport) -> None:
    with transaction.atomic():
        row = Node.objects.select_for_update().get(pk=node.pk)
        if [o["id"] for o in row.orphans or []] == [o["id"] for o in orphans]:
            return
        before = {"orphans": row.orphans}
        row.orphans = orphans
        row.save(update_fields=["orphans"])
        audit_record(
            action="orphans",
            object_type="node",
            object_key=row.name,
            object_repr=str(row),
            before=before,
            after={"orphans": orphans},
            actor=actor,
            message=f"node {row.name}'s agent runs "
            + (
                f"{len(orphans)} engine(s) the catalog does not hold: {', '.join(o['id'] for o in orphans)}; "
                "adopt them in the catalog or stop them on the agent"
                if orphans
                else "no engine the catalog does not hold"
            ),
        )
    if orphans:
        out.changed.append(f"node {node.name} orphans: {', '.join(o['id'] for o in orphans)}")
