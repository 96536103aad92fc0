"""A run's conversation with the nodes' agents: start, wait until ready, stop.

An agent that does not answer (restarted, upgraded, a blip) is asked again
within LLMGW_AGENT_ABSENT_SECONDS (the away window); one that refuses the
token or the request is not. The window is the node's, for the whole run:
once its agent has not answered any of the run's calls for that long (it is
down, or hung: it accepts connections and never answers), its node is marked
unreachable (audited) and given up for the rest of the run, every step at
once: no call is sent to it any more, each fails at once with that reason
(a replacement there fails, an old replica there is left ``stopping`` with its
cards). So a hung agent delays a restart by at most ``hung_agent_delay()``
seconds, once (docs/restarts.md). A replica's state is asked for as a long poll
(the agent answers when it changes, within LLMGW_AGENT_WAIT_SECONDS), so a
step learns its replacement is ready when the agent does. Nothing is sent to
an agent that enforces another launch policy than the control plane's.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from django.conf import settings
from llmgw_policy import default_policy

from agentclient.client import AgentCallFailed, AgentClient, describe_failure
from catalog.models import Node, Replica
from operations.models import RestartStep
from operations.services.reconcile import node_unreachable
from operations.services.runner.records import Records, StepFailed

# How often an agent that does not answer is asked again, within LLMGW_AGENT_ABSENT_SECONDS.
AWAY_RETRY_SECONDS = 1.0
# A replacement whose port another program holds moves up a port, this many times at most.
PORT_TRIES = 5
# The failures that say an agent does not answer (down, hung, cut off), as opposed to one that
# answered with a refusal.
NOT_ANSWERING = ("agent_down", "agent_slow")
# A node the run gave up on: every call to it fails at once with this code.
GIVEN_UP = "agent_given_up"
NOT_SENT = "not_sent"

T = TypeVar("T")


def longest_agent_call() -> float:
    """The longest one call of a run to an agent may take (a long poll, or a stop: its drain of the
    requests in flight, then its wait for the process)."""
    return max(
        settings.LLMGW_AGENT_TIMEOUT_SECONDS + settings.LLMGW_AGENT_WAIT_SECONDS,
        settings.LLMGW_STOP_DRAIN_SECONDS + settings.LLMGW_AGENT_STOP_SECONDS,
    )


def hung_agent_delay() -> float:
    """At most how long a node's agent that does not answer holds a run up, once, all its steps
    together: W + 3 C + R, W the absence window (LLMGW_AGENT_ABSENT_SECONDS), C the longest call
    (``longest_agent_call``), R the pause between two asks (AWAY_RETRY_SECONDS). Its first
    unanswered call returns within C; the window is over W later, noticed by the end of the next
    call (a pause and C more); the calls then in flight end within C."""
    return settings.LLMGW_AGENT_ABSENT_SECONDS + 3 * longest_agent_call() + AWAY_RETRY_SECONDS


def certainly_not_reached(exc: AgentCallFailed) -> bool:
    """The agent certainly did not act on the call: it refused the token or the request, or nothing
    listened on its port."""
    return (
        exc.code in ("agent_token", "agent_refused")
        or (exc.code == "agent_down" and "refused the connection" in exc.message)
        or (exc.code == GIVEN_UP and exc.agent_code == NOT_SENT)
    )


class AgentConversation:
    """One run's calls to the agents, and what their answers change in its records."""

    def __init__(self, records: Records):
        self.records = records
        self.op = records.op
        self.lease = records.lease
        self.clock = records.clock
        self.poll = settings.LLMGW_OPERATION_POLL_SECONDS
        self.wait = settings.LLMGW_AGENT_WAIT_SECONDS
        self.same_policy: set[str] = set()  # nodes whose agent was found to enforce our launch policy
        # Each node's agent, for all the run's steps (threads): since when (monotonic, when the first
        # unanswered call was asked) it has not answered, and the nodes given up, with why.
        self._absence = threading.Lock()
        self._silent_since: dict[str, float] = {}
        self._given_up: dict[str, AgentCallFailed] = {}
        # What each stop's agent said of its drain, by replica: put in the stopped replica's reason.
        self._stop_notes: dict[str, str] = {}

    def agent(self, node: Node) -> AgentClient:
        # What it says of the model's replicas is redacted of the model's profiles' secrets.
        return AgentClient.for_node(node, secrets=self.records.secrets)

    def call(self, node: Node, ask: Callable[[], T]) -> T:
        """``ask`` the node's agent, keeping its absence: a node the run gave up on is not asked
        (the call fails at once, ``GIVEN_UP``); one that has not answered any call of the run for
        LLMGW_AGENT_ABSENT_SECONDS is marked unreachable (audited) and given up, every step at once."""
        with self._absence:
            given_up = self._given_up.get(node.name)
        if given_up is not None:
            # This call was not sent: the agent certainly did not act on it.
            raise AgentCallFailed(GIVEN_UP, given_up.message, agent_code=NOT_SENT)
        asked = time.monotonic()
        try:
            answer = ask()
        except AgentCallFailed as exc:
            if exc.code not in NOT_ANSWERING:
                raise
            with self._absence:
                since = self._silent_since.setdefault(node.name, asked)
                silent = time.monotonic() - since
                first = silent >= settings.LLMGW_AGENT_ABSENT_SECONDS and node.name not in self._given_up
                if first:
                    self._given_up[node.name] = AgentCallFailed(
                        GIVEN_UP,
                        f"The agent of node {node.name} has not answered for {silent:.0f} s "
                        f"(LLMGW_AGENT_ABSENT_SECONDS is {settings.LLMGW_AGENT_ABSENT_SECONDS:g}): "
                        f"{exc.message} The node is marked unreachable and this restart gives it up.",
                    )
                given_up = self._given_up.get(node.name)
            if first:
                node_unreachable(node, reason=exc.message, actor=self.records.actor)
            if given_up is not None:
                raise given_up from None
            raise
        with self._absence:
            self._silent_since.pop(node.name, None)
        return answer

    def launch_and_wait(
        self,
        step: RestartStep,
        replica: Replica,
        spec: dict[str, Any],
        *,
        ready: Callable[[], None] | None = None,
    ) -> None:
        """PUT the spec (again: harmless) and wait until ready; StepFailed otherwise. ``ready`` is
        called the moment the agent says the replica is ready, before that is recorded.

        The agent is asked to answer when the replica's state changes (a long poll of at most
        LLMGW_AGENT_WAIT_SECONDS, and at most a heartbeat's interval so the lease stays fresh), so
        the step learns that its replacement is ready when the agent does. An agent that answers
        at once without a change (one that predates the long poll) is polled every
        LLMGW_OPERATION_POLL_SECONDS instead."""
        node = Node.objects.get(name=step.node)
        agent = self.agent(node)
        self.check_node_policy(node, agent, replica)
        replica, state = self._start(step, node, agent, replica, spec)
        said = ""
        if step.state == RestartStep.State.STARTING:
            # With what the agent answered, if it said anything: one write, not two in a row.
            said = _coming_up(state)
            self.records.set_step(
                step,
                state=RestartStep.State.WAITING,
                reason=_waiting_for(replica, state, said)
                if said
                else f"waiting for {replica.name} to be ready",
            )
        self._until_ready(step, node, agent, replica, state, ready, said=said)

    def _start(
        self, step: RestartStep, node: Node, agent: AgentClient, replica: Replica, spec: dict[str, Any]
    ) -> tuple[Replica, dict[str, Any]]:
        """PUT the spec, asking again within the away window; the replica (moved to another port
        when another program held its own) and the state the agent answered with."""
        movable = not step.in_place and replica.pk == step.new_replica_id
        moves = 0
        away_since: float | None = None
        while True:
            self.lease.tick()
            try:
                with self.clock.timed("agent: start"):
                    state = self.call(node, partial(agent.start, replica.name, spec))
                self.clock.mark(step.pk, "asked")
                return replica, state
            except AgentCallFailed as exc:
                if exc.agent_code == "port_busy" and movable and moves + 1 < PORT_TRIES:
                    # Another program on the node holds the port: a replacement nobody
                    # uses yet may as well take the next one.
                    moves += 1
                    replica, spec = self.records.move_port(step, replica, spec, node, exc.message)
                    continue
                certain = certainly_not_reached(exc)
                if movable and exc.code in ("agent_down", GIVEN_UP) and certain:
                    # Nothing listens where the agent should: a replacement may go to another node.
                    raise StepFailed(
                        f"{replica.name} could not be started: {exc.message}", started=False, node_down=True
                    ) from None
                away_since = away_since or time.monotonic()
                waited = time.monotonic() - away_since
                if (
                    exc.code in ("agent_token", "agent_refused", GIVEN_UP)
                    or waited >= settings.LLMGW_AGENT_ABSENT_SECONDS
                ):
                    raise StepFailed(
                        f"{replica.name} could not be started: {exc.message}", started=not certain
                    ) from None
                # A node's agent briefly away (restarted, upgraded): asked again within the window.
                time.sleep(min(AWAY_RETRY_SECONDS, settings.LLMGW_AGENT_ABSENT_SECONDS - waited))

    def _until_ready(
        self,
        step: RestartStep,
        node: Node,
        agent: AgentClient,
        replica: Replica,
        state: dict[str, Any],
        ready: Callable[[], None] | None,
        *,
        said: str = "",
    ) -> None:
        """Follow the replica's state from ``state`` (the start's answer), each change recorded,
        until ready within the restart's ready_timeout; StepFailed otherwise. ``said``: the
        agent's reason the step already says."""
        deadline = time.monotonic() + self.op.ready_timeout
        away_since = None
        recorded = Replica.objects.get(pk=replica.pk).state
        while True:
            self.lease.tick()
            now_state = state.get("state")
            if now_state == "ready" and ready is not None:
                ready()
            reason = _coming_up(state)
            if now_state in Replica.LIVE_STATES and now_state != recorded:
                # The step's reason, when the agent gave a new one, in the replica's transaction.
                progress = bool(reason) and reason != said
                self.records.replica_change(
                    replica.pk,
                    state=now_state,
                    action=now_state,
                    message=f"{replica.name} is {now_state} on {node.name}",
                    memory=dict(state.get("memory") or {}) if now_state == "ready" else None,
                    step=step if progress else None,
                    step_fields={"reason": _waiting_for(replica, state, reason)} if progress else None,
                )
                recorded, said = now_state, reason or said
            if now_state == "ready":
                self.clock.mark(step.pk, "ready")
                return
            if now_state == "failed":
                raise StepFailed(f"{replica.name} failed on {node.name}: {describe_failure(state)}")
            if now_state == "stopped":
                raise StepFailed(
                    f"{replica.name} was stopped on {node.name} before it was ready "
                    f"({state.get('reason') or 'no reason given'})."
                )
            if reason and reason != said:
                said = reason
                self.records.set_step(step, reason=_waiting_for(replica, state, reason))
            if time.monotonic() >= deadline:
                told = str(state.get("reason") or "")
                raise StepFailed(
                    f"{replica.name} was not ready within {self.op.ready_timeout:g} s "
                    f"({now_state}{': ' + told if told else ''})."
                )
            left = max(deadline - time.monotonic(), 0.01)
            wait = min(self.wait, left, self.lease.interval)
            asked = time.monotonic()
            try:
                with self.clock.timed("agent: get, waiting for a change (the long poll)"):
                    state = self.call(node, partial(agent.get, replica.name, wait=wait, unless=now_state))
                away_since = None
            except AgentCallFailed as exc:
                away_since = self.agent_away(step, replica, exc, away_since, left)
                continue
            if state.get("state") == now_state:
                self.poll_pause(asked, wait, left)

    def poll_pause(self, asked: float, wait: float, left: float) -> None:
        """The agent answered a wait of ``wait`` s asked at ``asked`` with no change: when it held
        the answer that long, ask again at once; when it answered sooner (an agent older than the
        long poll), or no wait was asked (LLMGW_AGENT_WAIT_SECONDS=0), poll every
        LLMGW_OPERATION_POLL_SECONDS. (A wait cut short by the heartbeat's interval is not a
        reason to sleep a poll's interval.)"""
        took = time.monotonic() - asked
        if wait <= 0 or took < wait:
            time.sleep(max(min(self.poll, left) - took, 0.0))

    def agent_away(
        self, step: RestartStep, replica: Replica, exc: AgentCallFailed, since: float | None, left: float
    ) -> float:
        """A poll of ``replica`` failed: wait a little and say so, while its agent has been away for
        less than LLMGW_AGENT_ABSENT_SECONDS (a restart, an upgrade, a blip); StepFailed after that,
        and at once for a refused token or a replica the agent does not know. Returns since when."""
        if exc.code in ("agent_token", "not_found", GIVEN_UP):
            raise StepFailed(f"{replica.name} could not be watched: {exc.message}") from None
        now = time.monotonic()
        if since is None:
            since = now
            self.records.set_step(
                step, reason=f"waiting for the agent of {step.node} to answer again: {exc.message}"
            )
        window = settings.LLMGW_AGENT_ABSENT_SECONDS
        if now - since >= window:
            raise StepFailed(
                f"{replica.name} could not be watched: its agent did not answer for {window:g} s "
                f"(LLMGW_AGENT_ABSENT_SECONDS): {exc.message}"
            ) from None
        time.sleep(max(min(AWAY_RETRY_SECONDS, left, window - (now - since)), 0.01))
        return since

    def check_node_policy(self, node: Node, agent: AgentClient, replica: Replica) -> None:
        """The node's agent enforces the same launch policy as the control plane:
        otherwise what one allowed the other might refuse (or the reverse), and
        nothing is sent. Asked once a run per node that agrees (an agent changing its policy
        within a run still applies its own to each start)."""
        if node.name in self.same_policy:
            return
        try:
            with self.clock.timed("agent: node (the launch policy's digest)"):
                theirs = self.call(node, agent.node_info).get("policy")
        except AgentCallFailed:
            # Not known to differ: the start that follows says what is wrong with
            # the agent, and the agent applies its own policy in any case.
            return
        ours = default_policy().digest
        if theirs == ours:
            self.same_policy.add(node.name)
            return
        said = f"launch policy {theirs}" if theirs else "no launch policy (an agent older than it)"
        raise StepFailed(
            f"{replica.name} was not started: the agent of node {node.name} enforces {said}, but the "
            f"control plane's is {ours}. Deploy the same agent/llmgw_policy/policy.toml to both.",
            started=False,
        )

    def confirm_stop(self, node: Node, name: str) -> AgentCallFailed | None:
        """Stop a replica on its agent, asking again while the agent does not answer, for at most
        LLMGW_AGENT_ABSENT_SECONDS: None once the agent confirmed the process is gone, else the
        last failure. A refused token or request is not asked again."""
        deadline = time.monotonic() + settings.LLMGW_AGENT_ABSENT_SECONDS
        while True:
            self.lease.tick()
            try:
                with self.clock.timed("agent: stop (answers once the process is gone)"):
                    answer = self.call(node, partial(self.agent(node).stop, name))
            except AgentCallFailed as exc:
                left = deadline - time.monotonic()
                if exc.code in ("agent_token", "agent_refused", GIVEN_UP) or left <= 0:
                    return exc
                time.sleep(min(AWAY_RETRY_SECONDS, left))
                continue
            note = stop_note(str(answer.get("reason") or ""))
            with self._absence:
                self._stop_notes[name] = note
            return None

    def keep_stop_note(self, name: str, note: str) -> None:
        """Keep what a stop's agent said of its drain for ``stop_said`` (a group's: rank 0's)."""
        with self._absence:
            self._stop_notes[name] = note

    def stop_said(self, name: str) -> str:
        """What the agent said of the confirmed stop of ``name`` beyond its own "stopped": how its
        drain went ("drained: 2 request(s) in flight finished in 1.4s", ...), "" when nothing."""
        with self._absence:
            return self._stop_notes.pop(name, "")


AGENT_STOPPED = "stopped through the API"  # the agent's own start of a stop's reason (supervisor.stop)


def stop_note(reason: str) -> str:
    """The agent's stop answer's reason without its generic start: "stopped through the API
    (drained: 2 request(s) in flight finished in 1.4s); killed with SIGKILL after 10s ..." is
    "drained: 2 request(s) in flight finished in 1.4s; killed with SIGKILL after 10s ..."."""
    said = reason.strip()
    if not said.startswith(AGENT_STOPPED):
        return ""  # not this stop's words: a replica that had ended already keeps its own reason
    said = said.removeprefix(AGENT_STOPPED).strip()
    parts = re.fullmatch(r"\((.*)\)(?:;\s*(.*))?", said, re.S)
    if parts is None:
        return said.strip("; ")
    return "; ".join(x.strip() for x in parts.groups() if x and x.strip())


def _coming_up(state: dict[str, Any]) -> str:
    """The agent's reason for a replica still coming up (starting, loading); '' otherwise."""
    return str(state.get("reason") or "") if state.get("state") in Replica.COMING_UP_STATES else ""


def _waiting_for(replica: Replica, state: dict[str, Any], reason: str) -> str:
    return f"waiting for {replica.name}: {state.get('state')}: {reason}"
