"""Settling: a replacement just ready must stay ready for the restart's settle time (as
Kubernetes' minReadySeconds, ``settle_seconds``, by default LLMGW_RESTART_SETTLE_SECONDS) before
its old replica is stopped. One that falls over meanwhile fails its step, and the old replica,
not touched yet, keeps serving."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from agentclient.client import AgentCallFailed, describe_failure
from catalog.models import Node, Replica
from operations.models import RestartStep
from operations.services.runner.conversation import AgentConversation
from operations.services.runner.records import StepFailed


def settle(agents: AgentConversation, step: RestartStep, replica: Replica) -> None:
    """Watch ``replica`` (ready) for the operation's settle time; StepFailed when it falls over
    meanwhile."""
    seconds = agents.op.settle_seconds
    if seconds <= 0:
        return
    node = Node.objects.get(name=step.node)
    agent = agents.agent(node)
    agents.records.set_step(
        step,
        reason=f"{replica.name} is ready; it must stay ready for {seconds:g} s before the step goes on",
    )
    began = time.monotonic()
    deadline = began + seconds
    away_since = None
    while True:
        agents.lease.tick()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        asked = time.monotonic()
        wait = min(agents.wait, left, agents.lease.interval)
        try:
            state = agents.call(node, partial(agent.get, replica.name, wait=wait, unless="ready"))
            away_since = None
        except AgentCallFailed as exc:
            away_since = agents.agent_away(step, replica, exc, away_since, left)
            continue
        if state.get("state") != "ready":
            raise _fell_over(agents, replica, state, began=began, seconds=seconds)
        agents.poll_pause(asked, wait, left)


def _fell_over(
    agents: AgentConversation, replica: Replica, state: dict[str, Any], *, began: float, seconds: float
) -> StepFailed:
    """The replacement was ready and no longer is: recorded failed, its cards freed, when the agent
    says its process is gone; the step's failure, saying when."""
    now_state = state.get("state")
    said = describe_failure(state) if now_state == "failed" else str(state.get("reason") or now_state)
    if now_state in Replica.ENDED_STATES:
        agents.records.replica_change(
            replica.pk,
            state=Replica.State.FAILED,
            action="fail",
            release=True,  # the agent says its process is gone
            reason=said,
            message=f"{replica.name} fell over {time.monotonic() - began:.1f} s after it was ready",
        )
    return StepFailed(
        f"{replica.name} was ready, then {now_state} {time.monotonic() - began:.1f} s later, within "
        f"the {seconds:g} s it had to stay ready: {said}",
        started=now_state not in Replica.ENDED_STATES,
    )
