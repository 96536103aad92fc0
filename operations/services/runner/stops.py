"""Stopping what a step started or replaces: a card is freed only once the agent confirmed the
stop. A stop not confirmed within LLMGW_AGENT_ABSENT_SECONDS leaves the replica ``stopping``,
holding its cards, for the reconciler to ask again."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from catalog.models import Node, Replica
from operations.models import RestartStep
from operations.services.runner.conversation import AgentConversation
from operations.services.runner.groups import replica_ranks, said_ranks, spans, stop_every_rank
from operations.services.runner.records import StepFailed, replacement


def stop_confirmed(
    agents: AgentConversation,
    replica: Replica,
    node: Node | None,
    *,
    end: str,
    why: str,
    step: RestartStep | None = None,
    before: dict[str, Any] | None = None,
    succeeded: str | None = None,
    group: bool | None = None,
) -> str:
    """Stop ``replica`` and, once its agent confirmed it, record it ``end`` with its cards freed;
    a stop not confirmed leaves it stopping, holding its cards (the reconciler asks again).
    '' when confirmed, else why not. A ready replica stopped for good is recorded stopping first
    (``drain_first``). A replica across nodes is stopped on every rank's agent (``_stop_group``).

    For ``step``, whose old replica this is: ``before``, its fields written before the agent is
    asked (with the drain when there is one); ``succeeded``, the reason it ends succeeded with,
    written with the confirmed stop. One transaction each rather than two in a row. ``group``:
    whether the replica spans nodes, when the caller read its shards already; read here otherwise."""
    records = agents.records
    if group is None:
        group = spans(replica)
    if group:
        if step is not None and before:
            records.set_step(step, **before)
        left = _stop_group(agents, replica, end=end, why=why)
        if not left and step is not None and succeeded is not None:
            records.finish_step(step, RestartStep.State.SUCCEEDED, succeeded)
        return left
    if node is not None and end == Replica.State.STOPPED and replica.state == Replica.State.READY:
        drain_first(agents, replica, why, step=step, step_fields=before)
    elif step is not None and before:
        records.set_step(step, **before)
    failure = agents.confirm_stop(node, replica.name) if node is not None else None
    if failure is not None:
        records.replica_change(
            replica.pk,
            state=Replica.State.STOPPING,
            action="stop_unconfirmed",
            reason=failure.message,
            message=f"{replica.name} was asked to stop ({why}), and its agent did not confirm it: "
            f"{failure.message} It keeps its cards until the agent does.",
        )
        return failure.message
    said = with_stop_note(why, agents.stop_said(replica.name))
    finish = (
        records.finished(RestartStep.State.SUCCEEDED, succeeded)
        if step is not None and succeeded is not None
        else None
    )
    records.replica_change(
        replica.pk,
        state=end,
        action="stop" if end == Replica.State.STOPPED else "fail",
        release=True,
        reason=said,
        message=f"stopped {replica.name}: {said}",
        step=step if finish else None,
        step_fields=finish,
    )
    if step is not None and finish:
        records.said_finished(step)
    return ""


def _stop_group(agents: AgentConversation, replica: Replica, *, end: str, why: str) -> str:
    """Stop every rank of a replica across nodes and, once every agent confirmed its rank's stop,
    record it ``end`` with all its cards freed; otherwise it is left stopping holding them all (the
    reconciler asks each agent again, freeing each node's cards as its agent confirms). '' when
    confirmed, else why not."""
    replica = Replica.objects.get(pk=replica.pk)
    ranks = said_ranks(replica_ranks(replica))
    if end == Replica.State.STOPPED and replica.state == Replica.State.READY:
        drain_first(agents, replica, why)
    confirmed, failures, note = stop_every_rank(agents, replica)
    if failures:
        said = " ".join(f.message for f in failures)
        agents.records.replica_change(
            replica.pk,
            state=Replica.State.STOPPING,
            action="stop_unconfirmed",
            reason=said,
            message=f"{replica.name} was asked to stop every rank ({why}); "
            + (f"{', '.join(confirmed)} confirmed, " if confirmed else "")
            + f"not: {said} It keeps its cards ({ranks}) until every agent confirms.",
        )
        return said
    said = with_stop_note(why, note)
    agents.records.replica_change(
        replica.pk,
        state=end,
        action="stop" if end == Replica.State.STOPPED else "fail",
        release=True,
        reason=said,
        message=f"stopped {replica.name}, every rank ({ranks}): {said}",
    )
    return ""


def with_stop_note(why: str, note: str) -> str:
    """Why a replica stopped, and what its agent said of the stop (how its drain went), if anything."""
    return f"{why} ({note})" if note else why


def drain_first(
    agents: AgentConversation,
    replica: Replica,
    why: str,
    *,
    step: RestartStep | None = None,
    step_fields: dict[str, Any] | None = None,
) -> None:
    """Stop sending it work before it stops: recorded ``stopping`` (no longer live, so no longer
    counted serving, and dropped by whatever routes from the catalog), audited, before the agent is
    asked; the agent then waits up to LLMGW_STOP_DRAIN_SECONDS for the engine's requests in flight
    before it signals it (docs/restarts.md, "Stops that drain")."""
    drain = settings.LLMGW_STOP_DRAIN_SECONDS
    agents.records.replica_change(
        replica.pk,
        state=Replica.State.STOPPING,
        action="drain",
        reason=f"draining before it stops: {why}",
        message=f"{replica.name} takes no new work and is being stopped ({why}): its agent lets the "
        f"requests in flight finish, for up to {drain:g} s, then stops it",
        step=step,
        step_fields=step_fields,
    )


def stop_replacement(agents: AgentConversation, step: RestartStep, failure: StepFailed) -> str:
    """Stop a replacement that did not come up; record it failed, cards released. Returns the reason."""
    records = agents.records
    new = Replica.objects.get(pk=replacement(step)[0].pk)
    reason = failure.reason
    records.set_step(step, reason=reason)  # kept, should this worker die while it cleans up
    if new.state not in Replica.HOLDING_STATES:
        return reason
    if failure.started or new.state == Replica.State.STOPPING:
        left = stop_confirmed(
            agents,
            new,
            Node.objects.get(name=step.node),
            # A replacement stopped because the restart was cancelled did not fail: it was stopped.
            end=Replica.State.STOPPED if failure.cancelled else Replica.State.FAILED,
            why=failure.reason if failure.cancelled else f"failed: {failure.reason}",
        )
        if left:
            reason += (
                f" It could not be stopped either: {left} It is recorded as stopping and keeps its "
                f"cards on {step.node} until its agent confirms the stop (the reconciler asks again)."
            )
    else:
        records.replica_change(
            new.pk,
            state=Replica.State.FAILED,
            action="fail",
            release=True,
            reason=failure.reason,
            message=f"{new.name} failed: {failure.reason}",
        )
    records.set_step(step, reason=reason)
    return reason
