"""A replica across nodes, started, watched and stopped as one unit (docs/restarts.md, "A group").

Its ranks (one engine process each, on its own node's agent; ``Shard.rank``) are every one of them
launched, then given one deadline (the restart's ``ready_timeout``) for every rank to join and
rank 0 to pass readiness. The replica is ready only when rank 0 serves (its agent's word: a token
generated) and every other rank's agent says its process is alive. Any rank lost (failed,
stopped, its agent gone past the away window) fails the whole replica: every rank is stopped,
rank 0 first (it drains), and its cards are freed only once every agent confirmed its stop.
Each rank's state, as its agent last said it, is kept on the step (``RestartStep.ranks``), which
the operation's page shows while the group starts.

A cancel asked while a group starts stops every rank the step started: a half-joined group
serves nothing and may hold its ranks' cards waiting for the others (vLLM #58290, SGLang #5457),
so it is not left to finish as a one-node replacement is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from django.conf import settings

from agentclient.client import AgentCallFailed, describe_failure
from catalog.models import Node, Replica, Shard
from operations.models import RestartOperation, RestartStep
from operations.services.runner.conversation import (
    AWAY_RETRY_SECONDS,
    GIVEN_UP,
    AgentConversation,
    certainly_not_reached,
)
from operations.services.runner.records import StepFailed
from operations.services.runner.settling import settle

RankRecord = dict[str, Any]  # {"rank", "node", "cards", "spec", "state", "reason", "sent"}


def replica_ranks(replica: Replica) -> list[tuple[int, str, list[int]]]:
    """Each rank of ``replica`` with its node's name and card indices there, rank 0 first, from its
    shards; [] when it holds no cards."""
    by_rank: dict[int, tuple[str, list[int]]] = {}
    for rank, node, index in (
        Shard.objects.filter(replica=replica)
        .order_by("rank", "card__index")
        .values_list("rank", "card__node__name", "card__index")
    ):
        by_rank.setdefault(rank, (node, []))[1].append(index)
    return [(rank, node, cards) for rank, (node, cards) in sorted(by_rank.items())]


def spans(replica: Replica) -> bool:
    """``replica`` is a group: it holds cards as more than one rank."""
    return Shard.objects.filter(replica=replica, rank__gt=0).exists()


def said_ranks(ranks: list[tuple[int, str, list[int]]] | list[RankRecord]) -> str:
    """ "rank 0 on gpu-a cards 0-3, rank 1 on gpu-b cards 0-3"."""
    rows = [(r["rank"], r["node"], r["cards"]) if isinstance(r, dict) else r for r in ranks]
    return ", ".join(f"rank {rank} on {node} cards {_cards(cards)}" for rank, node, cards in rows)


def _cards(cards: list[int]) -> str:
    return ", ".join(map(str, cards))


# -- launching and watching ------------------------------------------------------------------------


def launch_group(
    agents: AgentConversation, step: RestartStep, replica: Replica, field: str = "ranks"
) -> None:
    """PUT every rank's spec to its node's agent (again: harmless), then wait for the group:
    StepFailed when a rank cannot be started, one is lost, or the group is not ready within the
    restart's ``ready_timeout``. ``field``: the step's list of ranks to launch and keep the states
    in (``ranks``, the replacement's; ``old_ranks``, the old replica's, started again)."""
    ranks: list[RankRecord] = [dict(r) for r in getattr(step, field)]
    nodes = {name: Node.objects.get(name=name) for name in {r["node"] for r in ranks}}
    for node in nodes.values():  # every agent's launch policy checked before any rank starts
        agents.check_node_policy(node, agents.agent(node), replica)
    for rank in ranks:
        node = nodes[rank["node"]]
        try:
            state = _start_rank(agents, node, replica, rank)
        finally:
            agents.records.set_step(step, **{field: ranks})
        rank["state"], rank["reason"] = str(state.get("state") or ""), str(state.get("reason") or "")
    agents.clock.mark(step.pk, "asked")
    agents.records.set_step(
        step,
        **{field: ranks},
        **(
            {"state": RestartStep.State.WAITING, "reason": f"waiting for {replica.name}'s {len(ranks)} ranks"}
            if step.state == RestartStep.State.STARTING
            else {}
        ),
    )
    _until_ready(agents, step, replica, ranks, field)


def _start_rank(agents: AgentConversation, node: Node, replica: Replica, rank: RankRecord) -> dict[str, Any]:
    """PUT one rank's spec, asking again within the away window; the agent's answer."""
    agent = agents.agent(node)
    away_since: float | None = None
    while True:
        agents.lease.tick()
        try:
            with agents.clock.timed("agent: start (a rank)"):
                answer = agents.call(node, partial(agent.start, replica.name, rank["spec"]))
            rank["sent"] = True
            return answer
        except AgentCallFailed as exc:
            if not certainly_not_reached(exc):
                rank["sent"] = True  # it may have reached the agent: it is stopped with the others
            away_since = away_since or time.monotonic()
            waited = time.monotonic() - away_since
            if (
                exc.code in ("agent_token", "agent_refused", GIVEN_UP)
                or exc.agent_code == "port_busy"
                or (exc.code == "agent_down" and certainly_not_reached(exc))
                or waited >= settings.LLMGW_AGENT_ABSENT_SECONDS
            ):
                raise StepFailed(
                    f"rank {rank['rank']} of {replica.name} could not be started on {node.name}: "
                    f"{exc.message} A group starts whole or not at all: every rank started is stopped."
                ) from None
            time.sleep(min(AWAY_RETRY_SECONDS, settings.LLMGW_AGENT_ABSENT_SECONDS - waited))


def _until_ready(
    agents: AgentConversation, step: RestartStep, replica: Replica, ranks: list[RankRecord], field: str
) -> None:
    """Follow every rank until rank 0 is ready and every other rank alive, within the restart's
    ``ready_timeout`` (one deadline for the whole group); each change of a rank's state kept on the
    step, the replica's own state (rank 0's) recorded as it changes. StepFailed otherwise."""
    deadline = time.monotonic() + agents.op.ready_timeout
    recorded = Replica.objects.get(pk=replica.pk).state
    away: dict[str, float] = {}
    while True:
        states = _ask_ranks(agents, replica, ranks, away, wait=min(agents.wait, agents.lease.interval))
        _keep_states(agents, step, ranks, states, field)
        lost = _lost(replica, ranks, states)
        if lost:
            raise StepFailed(lost)
        rank0 = states.get(0) or {}
        now0 = str(rank0.get("state") or "")
        if now0 in ("starting", "loading") and now0 != recorded:
            agents.records.replica_change(
                replica.pk, state=now0, action=now0, message=f"{replica.name} is {now0} ({said_ranks(ranks)})"
            )
            recorded = now0
        if len(states) == len(ranks) and all(s.get("state") == "ready" for s in states.values()):
            agents.records.replica_change(
                replica.pk,
                state=Replica.State.READY,
                action="ready",
                message=f"{replica.name} is ready: rank 0 serves and its {len(ranks) - 1} other rank(s) are "
                f"alive ({said_ranks(ranks)})",
                memory=dict(rank0.get("memory") or {}),
            )
            agents.clock.mark(step.pk, "ready")
            return
        if time.monotonic() >= deadline:
            raise StepFailed(
                f"{replica.name} was not ready within {agents.op.ready_timeout:g} s: "
                + "; ".join(_rank_said(r) for r in ranks)
                + ". Every rank must join and rank 0 pass readiness by then."
            )
        # A cancel stops the replacement; the old group started again (``old_ranks``, in place) is
        # what the cancel leaves serving, so its start is not cut short by it.
        if field == "ranks" and _cancel_requested(agents.op):
            raise StepFailed(
                f"The restart was cancelled while {replica.name}'s ranks started: every rank started is "
                "stopped.",
                cancelled=True,
            )


def _ask_ranks(
    agents: AgentConversation,
    replica: Replica,
    ranks: list[RankRecord],
    away: dict[str, float],
    *,
    wait: float,
) -> dict[int, dict[str, Any]]:
    """Each rank's state as its agent says it now; rank 0's as a long poll of ``wait`` s (answered
    at once when its state changes), the others' at once. A rank whose agent does not answer is
    left out while its node has been away for less than LLMGW_AGENT_ABSENT_SECONDS; StepFailed
    after that, and at once for a refused token or a rank its agent does not know."""
    agents.lease.tick()
    states: dict[int, dict[str, Any]] = {}
    asked = time.monotonic()
    for rank in sorted(ranks, key=lambda r: -r["rank"]):  # rank 0 last: its long poll holds
        node = Node.objects.get(name=rank["node"])
        agent = agents.agent(node)
        long_poll = rank["rank"] == 0 and wait > 0
        ask = (
            partial(agent.get, replica.name, wait=wait, unless=rank.get("state") or "starting")
            if long_poll
            else partial(agent.get, replica.name)
        )
        try:
            states[rank["rank"]] = agents.call(node, ask)
            away.pop(node.name, None)
        except AgentCallFailed as exc:
            since = away.setdefault(node.name, time.monotonic())
            if exc.code in ("agent_token", "not_found", GIVEN_UP) or (
                time.monotonic() - since >= settings.LLMGW_AGENT_ABSENT_SECONDS
            ):
                raise StepFailed(
                    f"rank {rank['rank']} of {replica.name} on {node.name} could not be watched: {exc.message} "
                    "A rank lost takes the whole replica down."
                ) from None
    # As a one-node poll (``AgentConversation.poll_pause``): a change is acted on at once; an answer
    # that came sooner than the wait without one (an agent older than the long poll), or no rank 0
    # answer at all, is asked again after LLMGW_OPERATION_POLL_SECONDS.
    before = next((r.get("state") or "starting" for r in ranks if r["rank"] == 0), None)
    changed = 0 in states and states[0].get("state") != before
    if not changed and (0 not in states or wait <= 0 or time.monotonic() - asked < wait):
        time.sleep(max(agents.poll - (time.monotonic() - asked), 0.0))
    return states


def _keep_states(
    agents: AgentConversation,
    step: RestartStep,
    ranks: list[RankRecord],
    states: dict[int, dict[str, Any]],
    field: str,
) -> None:
    """Each rank's state and reason as its agent said them, kept on the step when one changed."""
    changed = False
    for rank in ranks:
        state = states.get(rank["rank"])
        if state is None:
            continue
        now = (str(state.get("state") or ""), str(state.get("reason") or ""))
        if now != (rank.get("state"), rank.get("reason")):
            rank["state"], rank["reason"] = now
            changed = True
    if changed:
        agents.records.set_step(step, **{field: ranks})


def _lost(replica: Replica, ranks: list[RankRecord], states: dict[int, dict[str, Any]]) -> str:
    """Why the group is lost (a rank failed or stopped on its agent), or ''."""
    for rank in ranks:
        state = states.get(rank["rank"])
        if state is not None and state.get("state") in Replica.ENDED_STATES:
            return (
                f"rank {rank['rank']} of {replica.name} {state.get('state')} on {rank['node']}: "
                f"{describe_failure(state)} A rank lost takes the whole replica down: every rank is stopped."
            )
    return ""


def _rank_said(rank: RankRecord) -> str:
    said = f"rank {rank['rank']} on {rank['node']} {rank.get('state') or 'not asked'}"
    return f"{said} ({rank['reason']})" if rank.get("reason") else said


def _cancel_requested(op: RestartOperation) -> bool:
    return RestartOperation.objects.filter(pk=op.pk, cancel_requested=True).exists()


def settle_group(agents: AgentConversation, step: RestartStep, replica: Replica) -> None:
    """Every rank must stay ready (rank 0 serving, the others alive) for the settle time; StepFailed
    naming the rank that fell over."""
    seconds = agents.op.settle_seconds
    if seconds <= 0:
        return
    ranks: list[RankRecord] = [dict(r) for r in step.ranks]
    agents.records.set_step(
        step,
        reason=f"{replica.name} is ready; every rank must stay so for {seconds:g} s before the step goes on",
    )
    deadline = time.monotonic() + seconds
    away: dict[str, float] = {}
    while time.monotonic() < deadline:
        wait = min(agents.wait, agents.lease.interval, max(deadline - time.monotonic(), 0.0))
        states = _ask_ranks(agents, replica, ranks, away, wait=wait)
        _keep_states(agents, step, ranks, states, "ranks")
        fell = [r for r in ranks if r["rank"] in states and states[r["rank"]].get("state") != "ready"]
        if fell:
            state = states[fell[0]["rank"]]
            raise StepFailed(
                f"{replica.name} was ready, then its rank {fell[0]['rank']} on {fell[0]['node']} was "
                f"{state.get('state')} within the {seconds:g} s it had to stay ready: {describe_failure(state)}"
            )


# -- stopping ----------------------------------------------------------------------------------------


def stop_every_rank(
    agents: AgentConversation, replica: Replica
) -> tuple[list[str], list[AgentCallFailed], str]:
    """Ask every rank's agent to stop it, rank 0 first (it drains; the others then lose their peer
    and exit, as NCCL's do): the ranks confirmed, the failures of those not, and what rank 0's
    agent said of its drain."""
    confirmed: list[str] = []
    failures: list[AgentCallFailed] = []
    note = ""
    for rank, node_name, _ in replica_ranks(replica):
        failure = agents.confirm_stop(Node.objects.get(name=node_name), replica.name)
        said = agents.stop_said(replica.name)
        if failure is None:
            confirmed.append(f"rank {rank} on {node_name}")
            note = note or (said if rank == 0 else "")
        else:
            failures.append(
                AgentCallFailed(
                    failure.code,
                    f"rank {rank} on {node_name}: {failure.message}",
                    status=failure.status,
                    agent_code=failure.agent_code,
                )
            )
    return confirmed, failures, note


def launch_and_settle(
    agents: AgentConversation,
    step: RestartStep,
    replica: Replica,
    spec: dict[str, Any],
    *,
    ready: Callable[[], None] | None = None,
) -> None:
    """Start the step's replacement, wait until it is ready, and watch it settle: every rank of a
    replacement across nodes (``step.ranks``), else the one replica as ever. ``ready``: called
    once a one-node replacement with no settle time is ready by its agent's word, before the
    write that records it (the run's next step need not wait for that write)."""
    if step.ranks:
        launch_group(agents, step, replica)
        settle_group(agents, step, replica)
        return
    agents.launch_and_wait(step, replica, spec, ready=ready if agents.op.settle_seconds <= 0 else None)
    settle(agents, step, replica)
