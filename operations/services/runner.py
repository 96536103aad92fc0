"""The worker's run of a restart operation, step by step.

``run_operation`` is the body of the worker's task: it claims the operation
(``operations/services/lease.py``: claiming, heartbeats and takeover) and
runs its steps, each one replica:

Rolling (the default, where a node has room): the replacement is placed on
free cards (``operations/services/placement.py``), recorded with its shards, PUT to
its node's agent, and polled until ready; only then is the old replica
stopped and its cards released. A replica is never stopped before its
replacement is ready.

In place (asked for, or no room beside): the old replica is stopped and its
cards released, the replacement starts on the same cards and port, and the
model does not answer while it loads.

A replacement that fails (exit code and log tail), is not ready by its
deadline, or whose agent is down, refuses the token, fails or is too slow,
fails its step: the replacement is stopped and recorded failed with its cards
released; rolling, the old replica keeps serving; in place, the old spec is
started again on its cards. The operation then starts no new step: the steps
left are cancelled and it ends failed (nothing restarted) or partly_failed.

Steps run ``max_parallel`` at a time, each in a thread of its own: a step holds
its slot until its replacement is ready (in place, until it ends), and stops its
old replica beside the next steps, so the next one starts the moment a
replacement is ready rather than once an old engine has exited. A step whose
planned cards a step under way still holds (its old replica, stopping) waits for
that step to end while a later one whose cards are free goes first
(``_next_with_its_cards``). The writes of the steps hold the operation's row
together (``Lease.hold``), not one at a time.

Every row written here is audited in the same transaction, by the worker,
with the operator who asked named in the message. Where a run's time goes is
logged at DEBUG (``operations/services/timing.py``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from queue import Empty, SimpleQueue
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from llmgw_policy import default_policy

from agentclient.client import AgentCallFailed, AgentClient, describe_failure
from audit.services import audit_record, snapshot
from base.actor import Actor, acting_as
from base.secrets import profile_secrets, redact
from catalog.models import Card, Node, Profile, Replica, Shard
from catalog.services.fit import profile_memory
from operations.models import RestartOperation, RestartStep
from operations.services.lease import Lease, OperationLost, claim, threads_share_the_database, worker_name
from operations.services.placement import (
    best_fit,
    foreign_held_card_ids,
    free_port,
    in_place_cards,
    lock_placement,
    orphan_cards,
    replica_name,
    replica_placement,
)
from operations.services.reconcile import node_unreachable
from operations.services.specs import replica_spec, running_spec
from operations.services.timing import RunClock

log = logging.getLogger("operations.restart")

# The agent's own deadline is a backstop for a worker that died: ours comes first.
AGENT_DEADLINE_MARGIN = 30.0
# How often an agent that does not answer is asked again, within LLMGW_AGENT_ABSENT_SECONDS.
AWAY_RETRY_SECONDS = 1.0
# Nodes a replacement is placed on in turn when each one's agent turns out to be down.
PLACE_TRIES = 3
# A replacement whose port another program holds moves up a port, this many times at most.
PORT_TRIES = 5


def serving_sentence(model: str, serving: int) -> str:
    """How many replicas serve the model, in the words an operation's summary uses."""
    if serving == 0:
        return f"{model} has no replica serving now"
    return f"{model} has {serving} replica(s) serving now"


def run_operation(operation_id: int, *, worker: str | None = None) -> str:
    """Claim the operation and run it to its end; returns its final state.

    "not_claimed" when it is finished, or held by a live worker; "lost" when
    another worker took it over while this one ran (this one then stops
    without touching anything more).
    """
    worker = worker or worker_name()
    actor = Actor(via="worker", name=worker, request_id=f"restart-{operation_id}")
    with acting_as(actor):
        op = claim(operation_id, worker)
        if op is None:
            return "not_claimed"
        log.info("%s: running restart #%s (attempt %s)", worker, op.pk, op.attempts)
        lease = Lease(op.pk, worker, epoch=op.attempts)
        lease.start()
        try:
            return OperationRun(op, lease, actor).run()
        except OperationLost:
            return "lost"
        finally:
            lease.stop()


class StepFailed(Exception):
    """A step failed, for ``reason``."""

    def __init__(self, reason: str, *, started: bool = True, node_down: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.started = started  # False: the agent certainly did not start the replacement
        self.node_down = node_down  # its node's agent refused the connection: another node may do


def _certainly_not_reached(exc: AgentCallFailed) -> bool:
    """The agent certainly did not act on the call: it refused the token or the request, or nothing
    listened on its port."""
    return exc.code in ("agent_token", "agent_refused") or (
        exc.code == "agent_down" and "refused the connection" in exc.message
    )


def _replaced(step: RestartStep) -> Replica:
    """The replica the step replaces, as the step loaded it."""
    if step.old_replica is None:
        raise StepFailed("The replica this step restarts was removed from the catalog.", started=False)
    return step.old_replica


def _replacement(step: RestartStep) -> tuple[Replica, dict[str, Any]]:
    """The step's replacement and the spec recorded for it."""
    if step.new_replica is None or step.spec is None:
        raise StepFailed(
            "The replacement recorded for this step was removed from the catalog.", started=False
        )
    return step.new_replica, step.spec


class OperationRun:
    """One worker's run of a claimed operation."""

    def __init__(self, op: RestartOperation, lease: Lease, actor: Actor):
        self.op = RestartOperation.objects.select_related("model", "profile").get(pk=op.pk)
        self.lease = lease
        self.actor = actor
        self.poll = settings.LLMGW_OPERATION_POLL_SECONDS
        self.wait = settings.LLMGW_AGENT_WAIT_SECONDS
        # Steps in threads (each with its own connection), or one after the other. One at a time
        # too, a step's old replica stops in its thread while the next step's replacement starts.
        self.threaded = threads_share_the_database()
        self.clock = RunClock(self.op.pk, self.op.max_parallel)
        self.same_policy: set[str] = set()  # nodes whose agent was found to enforce our launch policy
        # From the step threads to the run loop: (step, ended?, its end state or exception).
        self._events: SimpleQueue[tuple[int, bool, str | Exception | None]] = SimpleQueue()
        self.lease.timed = self.clock.add
        self.secrets = [
            secret
            for profile in Profile.objects.filter(model_id=self.op.model_id)
            for secret in profile_secrets(profile.engine, profile.env or {})
        ]

    # -- locks (timed: operations/services/timing.py) ------------------------------------------

    def _hold(self, *, alone: bool = False) -> None:
        with self.clock.timed("wait: the operation's row (the lease's fence)"):
            self.lease.hold(alone=alone)

    def _lock_placement(self) -> None:
        with self.clock.timed("wait: the placement lock"):
            lock_placement()

    def _audit(self, **entry: Any) -> None:
        with self.clock.timed("audit_record (waits for the chain's lock)"):
            audit_record(actor=self.actor, **entry)

    # -- audit -----------------------------------------------------------------------------------

    def _said(self, text: str) -> str:
        return f"{text} (restart #{self.op.pk} of {self.op.model.name}, asked by {self.op.requested_by_name})"

    def _replica_after(self, replica: Replica, cards: list[str]) -> dict[str, Any]:
        return {**snapshot(replica), "cards": cards}

    def _replica_change(
        self,
        replica_id: int,
        *,
        state: str,
        action: str,
        message: str,
        release: bool = False,
        hold: tuple[Node, list[int]] | None = None,
        memory: dict[str, Any] | None = None,
        reason: str | None = None,
    ) -> Replica:
        """Set a replica's state, release or take its cards, and audit it, in one
        transaction; with ``memory`` (the agent's report, once ready), keep what
        its cards were planned to hold beside what the engine and card reported."""

        @transaction.atomic
        def write() -> Replica:
            self._hold()
            replica = Replica.objects.select_for_update().get(pk=replica_id)
            held = [str(s.card) for s in Shard.objects.filter(replica=replica).select_related("card__node")]
            before = self._replica_after(replica, held)
            replica.state = state
            fields = ["state"]
            if reason is not None:
                replica.reason = redact(reason, self.secrets)
                fields.append("reason")
            if memory is not None:
                profile = Profile.objects.select_related("model", "gpu_class").get(pk=replica.profile_id)
                planned = profile_memory(profile, profile.model)
                replica.planned_memory = planned.as_dict() if planned is not None else {}
                replica.measured_memory = memory
                replica.measured_at = timezone.now() if memory else None
                fields += ["planned_memory", "measured_memory", "measured_at"]
            replica.save(update_fields=fields)
            if release:
                Shard.objects.filter(replica=replica).delete()
                held = []
            if hold is not None:
                node, indices = hold
                cards = list(Card.objects.filter(node=node, index__in=indices).select_related("node"))
                Shard.objects.bulk_create(Shard(replica=replica, card=c) for c in cards)
                held = [str(c) for c in cards]
            self._audit(
                action=action,
                object_type="replica",
                object_key=replica.name,
                object_repr=str(replica),
                before=before,
                after=self._replica_after(replica, held),
                message=self._said(message),
            )
            return replica

        with self.clock.timed("write: a replica's state (transaction)"):
            return write()

    # -- steps: bookkeeping ----------------------------------------------------------------------

    def _step(self, step_id: int) -> RestartStep:
        return RestartStep.objects.select_related("old_replica", "new_replica").get(pk=step_id)

    def _set_step(self, step: RestartStep, **fields: Any) -> None:
        if isinstance(fields.get("reason"), str):
            # An engine's log tail or an agent's sentence may echo a secret of the profile's.
            fields["reason"] = redact(fields["reason"], self.secrets)
        with self.clock.timed("write: a step's state (transaction)"), transaction.atomic():
            self._hold()
            RestartStep.objects.filter(pk=step.pk).update(**fields)
        for name, value in fields.items():
            setattr(step, name, value)

    def _finish_step(self, step: RestartStep, state: str, reason: str) -> str:
        reason = redact(reason, self.secrets)
        self._set_step(step, state=state, reason=reason, finished_at=timezone.now())
        log.info("restart #%s step %s: %s: %s", self.op.pk, step.pk, state, reason)
        return state

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> str:
        op = self.op
        if op.attempts > settings.LLMGW_OPERATION_MAX_ATTEMPTS:
            return self._give_up()
        steps = list(op.steps.order_by("id").values_list("pk", "state"))
        resume = [pk for pk, state in steps if state in RestartStep.IN_FLIGHT_STATES]
        queue = deque(resume + [pk for pk, state in steps if state == RestartStep.State.PENDING])
        # A step that failed in an earlier attempt already stopped the operation starting new ones.
        stopping = op.stop_at_first_failure and any(state == RestartStep.State.FAILED for _, state in steps)
        cancelled = False
        # A step holds one of the max_parallel slots until its replacement is ready (in place: until
        # it ends); then it stops its old replica beside the next steps, ending when the stop is
        # confirmed. ``loading``: the steps holding a slot; ``under_way``: every step not ended.
        loading: set[int] = set()
        under_way: set[int] = set()
        pool = (
            ThreadPoolExecutor(max_workers=2 * op.max_parallel, thread_name_prefix=f"restart-{op.pk}")
            if self.threaded
            else None
        )
        try:
            while queue or under_way:
                self.lease.tick()
                while queue and len(loading) < op.max_parallel and len(under_way) < 2 * op.max_parallel:
                    step_id = queue[0]
                    if step_id not in resume:  # steps in flight are always finished
                        if stopping or cancelled:
                            break
                        if RestartOperation.objects.filter(pk=op.pk, cancel_requested=True).exists():
                            cancelled = True
                            break
                        if under_way:
                            ready = self._next_with_its_cards(queue, resume, list(under_way))
                            if ready is None:
                                break  # the steps under way free the cards: wait for the next to end
                            step_id = ready
                    queue.remove(step_id)
                    self.clock.submitted(step_id)
                    if pool is None:
                        self.clock.slots(1)
                        if self._run_step(step_id) == RestartStep.State.FAILED:
                            stopping = op.stop_at_first_failure
                    else:
                        loading.add(step_id)
                        under_way.add(step_id)
                        pool.submit(self._run_step_in_thread, step_id)
                if pool is None and (stopping or cancelled or not queue):
                    break
                if under_way:
                    self.clock.slots(len(loading), empty_because="cards" if queue else "done")
                    for step_id, ended, outcome in self._next_events():
                        loading.discard(step_id)
                        if not ended:
                            continue  # its replacement is ready: its slot is free
                        under_way.discard(step_id)
                        if isinstance(outcome, Exception):
                            raise outcome
                        if outcome == RestartStep.State.FAILED:
                            stopping = stopping or op.stop_at_first_failure
                    self.clock.slots(len(loading))
                elif stopping or cancelled:
                    break
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        self.lease.tick()
        self.clock.summary()
        if (
            not cancelled
            and RestartOperation.objects.filter(pk=op.pk, cancel_requested=True).exists()
            and queue
        ):
            cancelled = True
        return self._finish(cancelled=cancelled)

    def _next_with_its_cards(self, queue: deque[int], resume: list[int], running: list[int]) -> int | None:
        """The first queued step whose planned cards no other step of the run is yet to free, or None.

        The plan (``place_restart``) counts in waves of ``max_parallel``: a step's cards may be
        ones an earlier step's old replica frees. The run starts a step as soon as a slot is free
        (a replacement ready), so the step whose turn comes may find its cards still held by the
        old replica of a step under way, or of a step still queued that a step let go first; a
        later step whose cards are free starts in its place (the plan gave those cards to that
        step alone, so taking them early changes no other step's), and with none, the run waits
        for the next step to end. Cards held by anything else (another restart's replica, or the
        old replica of a step that failed) are not waited for: the step starts and finds the
        fleet changed.
        """
        pending = [pk for pk in queue if pk not in resume]
        steps = {
            r["pk"]: r
            for r in RestartStep.objects.filter(pk__in=[*running, *pending]).values(
                "pk", "planned_node", "planned_cards", "old_replica_id"
            )
        }
        freeing = {r["old_replica_id"] for r in steps.values()} - {None}
        nodes = {steps[pk]["planned_node"] for pk in pending if pk in steps and steps[pk]["planned_node"]}
        held = {
            (node, index): replica
            for node, index, replica in Shard.objects.filter(
                card__node__name__in=nodes, replica_id__in=freeing
            ).values_list("card__node__name", "card__index", "replica_id")
        }
        for pk in pending:
            step = steps.get(pk)
            if step is None or not step["planned_node"]:
                return pk
            holders = {held.get((step["planned_node"], i)) for i in step["planned_cards"]}
            if not holders - {None, step["old_replica_id"]}:  # in place, its own cards are its to free
                return pk
        return None

    def _run_step_in_thread(self, step_id: int) -> None:
        try:
            outcome: str | Exception = self._run_step(step_id)
        except Exception as exc:  # OperationLost, or worse: the run loop raises it
            outcome = exc
        finally:
            connection.close()  # each thread has its own connection
        self._events.put((step_id, True, outcome))

    def _slot_free(self, step: RestartStep) -> None:
        """The step's replacement is ready: the run may start the next step while this one stops
        its old replica (whose cards the run still counts as held until this step ends)."""
        if self.threaded:
            self._events.put((step.pk, False, None))

    def _next_events(self) -> list[tuple[int, bool, str | Exception | None]]:
        """What the step threads said (a slot freed, a step ended) within a heartbeat's interval:
        the first to come and all that came with it; none when nothing did."""
        try:
            events = [self._events.get(timeout=self.lease.interval)]
        except Empty:
            return []
        while True:
            try:
                events.append(self._events.get_nowait())
            except Empty:
                return events

    def _run_step(self, step_id: int) -> str:
        self.clock.mark(step_id, "began")
        try:
            return self._run_step_marked(step_id)
        finally:
            self.clock.mark(step_id, "done")

    def _run_step_marked(self, step_id: int) -> str:
        step = self._step(step_id)
        try:
            if step.state == RestartStep.State.PENDING:
                return self._begin(step)
            return self._resume(step)
        except OperationLost:
            raise
        except Exception as exc:  # a bug or a database error: the step fails, the rest is not swallowed
            log.exception("restart #%s step %s failed unexpectedly", self.op.pk, step.pk)
            step = self._step(step_id)
            if step.is_finished:
                raise
            return self._fail(
                step, f"The worker failed on this step ({type(exc).__name__}: {exc}); see its log."
            )

    # -- one step --------------------------------------------------------------------------------

    def _begin(self, step: RestartStep) -> str:
        old = step.old_replica
        if old is None or not (old.is_live or old.state == Replica.State.UNKNOWN):
            state = old.state if old is not None else "removed"
            return self._finish_step(
                step,
                RestartStep.State.CANCELLED,
                f"{old.name if old else 'The replica'} is {state}: nothing to restart.",
            )
        node, cards = replica_placement(old)
        if node is None:
            return self._finish_step(
                step,
                RestartStep.State.FAILED,
                f"{old.name} holds no cards, so there is no node to restart it on.",
            )
        old_spec = running_spec(old, node_cards=cards, ready_timeout=self._agent_timeout())
        if step.planned_node:
            return self._follow_plan(step, old, node, old_spec)
        if not self.op.in_place:
            placed = self._place_beside(step, old_spec)
            if placed:
                return self._roll(step)
            if self.op.in_place is False:
                return self._finish_step(
                    step,
                    RestartStep.State.FAILED,
                    f"No ready node has {self.op.profile.cards} free card(s) of class "
                    f"{self.op.profile.gpu_class} beside the running replicas, and the restart was asked to be "
                    f"rolling only: free cards, or restart in place. {old.name} keeps serving.",
                )
        planned = in_place_cards(
            Profile.objects.select_related("gpu_class").get(pk=self.op.profile_id), old, node
        )
        if isinstance(planned, str):
            return self._finish_step(step, RestartStep.State.FAILED, f"{planned} {old.name} keeps serving.")
        self._set_step(
            step,
            in_place=True,
            state=RestartStep.State.STOPPING,
            started_at=timezone.now(),
            node=node.name,
            cards=planned,
            old_spec=old_spec,
            reason=f"stopping {old.name} to free its cards",
        )
        return self._stop_then_start(step)

    def _follow_plan(
        self, step: RestartStep, old: Replica, node: Node, old_spec: dict[str, Any] | None
    ) -> str:
        """The step as the restart's plan placed it (restart_start played the whole
        restart through); when the fleet changed since, the step fails saying how."""
        planned = list(step.planned_cards)
        where = f"{step.planned_node} cards {', '.join(map(str, planned))}"
        if step.planned_in_place:
            usable = in_place_cards(
                Profile.objects.select_related("gpu_class").get(pk=self.op.profile_id), old, node
            )
            own_and_free = set(
                Card.objects.filter(node=node, gpu_class_id=self.op.profile.gpu_class_id)
                .filter(Q(shard__isnull=True) | Q(shard__replica=old))
                .values_list("index", flat=True)
            )
            if isinstance(usable, str) or node.name != step.planned_node or not set(planned) <= own_and_free:
                return self._finish_step(
                    step,
                    RestartStep.State.FAILED,
                    f"The fleet changed since the restart was planned: {old.name} was to restart in place on "
                    f"{where}, and those cards are no longer its own or free. {old.name} keeps serving.",
                )
            self._set_step(
                step,
                in_place=True,
                state=RestartStep.State.STOPPING,
                started_at=timezone.now(),
                node=node.name,
                cards=planned,
                old_spec=old_spec,
                reason=f"stopping {old.name} to free its cards",
            )
            return self._stop_then_start(step)
        # The plan assumed the steps before this one succeeded; when one did not (or the fleet moved),
        # the best fit now stands in for it.
        placed = self._place_beside(step, old_spec, planned=(step.planned_node, planned))
        if placed or self._place_beside(step, old_spec):
            return self._roll(step)
        return self._finish_step(
            step,
            RestartStep.State.FAILED,
            f"The fleet changed since the restart was planned: {old.name}'s replacement was to start on {where}, "
            f"and those cards are no longer free on a ready node. {old.name} keeps serving; restart again to plan "
            "anew.",
        )

    def _resume(self, step: RestartStep) -> str:
        """A step a worker left in flight: pick it up where the records say it was."""
        new = step.new_replica
        if new is not None and new.state == Replica.State.STOPPING:
            # A replacement whose stop was not confirmed: ask again before anything else.
            reason = self._stop_replacement(step, StepFailed(step.reason or f"{new.name} failed"))
            if step.in_place:
                return self._restore(step, reason)
            return self._finish_step(step, RestartStep.State.FAILED, reason)
        if step.in_place:
            if new is None:
                return self._stop_then_start(step)
            if new.is_live:
                return self._wait_in_place(step)
            return self._restore(step, step.reason or f"{new.name} failed")
        if new is None:
            return self._begin(step)
        if step.state == RestartStep.State.STOPPING:
            return self._stop_old(step)
        if new.is_live:
            return self._roll(step)
        return self._finish_step(step, RestartStep.State.FAILED, step.reason or f"{new.name} failed")

    # rolling

    def _place_beside(
        self,
        step: RestartStep,
        old_spec: dict[str, Any] | None,
        *,
        planned: tuple[str, list[int]] | None = None,
    ) -> bool:
        """Record the replacement on free cards beside the old replica: on the
        ``planned`` node and cards when given, else the best fit; False when
        there is no room (or the planned cards are no longer free)."""

        @transaction.atomic
        def write() -> bool:
            self._hold()
            self._lock_placement()
            profile = Profile.objects.select_related("model", "gpu_class").get(pk=self.op.profile_id)
            if planned is not None:
                node_name, indices = planned
                cards = list(
                    Card.objects.filter(
                        node__name=node_name,
                        node__state=Node.State.READY,
                        node__reachable=True,
                        gpu_class_id=profile.gpu_class_id,
                        shard__isnull=True,
                        index__in=indices,
                    )
                    .exclude(pk__in=foreign_held_card_ids())  # a foreign process took one since the plan
                    .select_related("node")
                    .order_by("index")
                )
                if len(cards) != len(indices) or len(cards) != profile.cards:
                    return False
                if orphan_cards(cards[0].node) & set(indices):
                    return False  # an orphan engine runs there: the best fit stands in
                node = cards[0].node
            else:
                fit = best_fit(profile, replacing=step.old_replica)
                if fit is None:
                    return False
                node, cards = fit
            old = _replaced(step)
            self._record_replacement(
                step,
                profile,
                node,
                cards,
                port=free_port(node),
                said=lambda new, port: (
                    f"started {new} on {node.name} cards {[c.index for c in cards]} port {port}, "
                    f"revision {profile.revision}, to replace {old.name}"
                ),
                reason=lambda new: f"starting {new} on {node.name} beside {old.name}",
                started_at=timezone.now(),
                old_spec=old_spec,
                in_place=False,
            )
            return True

        with self.clock.timed("write: placing a replacement (transaction)"):
            placed = write()
        if placed:
            self.clock.mark(step.pk, "placed")
        return placed

    def _record_replacement(
        self,
        step: RestartStep,
        profile: Profile,
        node: Node,
        cards: list[Card],
        *,
        port: int,
        said: Callable[[str, int], str],
        reason: Callable[[str], str],
        **fields: Any,
    ) -> Replica:
        """In the caller's transaction, record the step's replacement on ``cards`` and ``port``
        of ``node`` (rolling beside the old replica, or in place on its cards), with the spec it
        is to be sent, audited with ``said(name, port)``; the step is set starting there, with
        ``reason(name)`` and ``fields``."""
        spec = replica_spec(
            profile, port=port, cards=[c.index for c in cards], ready_timeout=self._agent_timeout()
        )
        new = Replica.objects.create(
            name=replica_name(profile.model, step),
            profile=profile,
            port=port,
            state=Replica.State.STARTING,
            revision=profile.revision,
        )
        Shard.objects.bulk_create(Shard(replica=new, card=c) for c in cards)
        self._audit(
            action="start",
            object_type="replica",
            object_key=new.name,
            object_repr=str(new),
            after=self._replica_after(new, [str(c) for c in cards]),
            message=self._said(said(new.name, port)),
        )
        fields |= {
            "new_replica": new,
            "node": node.name,
            "cards": [c.index for c in cards],
            "spec": spec,
            "state": RestartStep.State.STARTING,
            "reason": reason(new.name),
        }
        RestartStep.objects.filter(pk=step.pk).update(**fields)
        for name, value in fields.items():
            setattr(step, name, value)
        return new

    def _roll(self, step: RestartStep, *, tries: int = 1) -> str:
        new, spec = _replacement(step)
        try:
            self._launch_and_wait(step, new, spec)
            self._settle(step, new)
        except StepFailed as exc:
            if exc.node_down and tries < PLACE_TRIES and self._place_elsewhere(step, exc):
                return self._roll(step, tries=tries + 1)
            reason = self._stop_replacement(step, exc)
            return self._finish_step(
                step, RestartStep.State.FAILED, f"{reason} {_replaced(step).name} keeps serving."
            )
        return self._stop_old(step)

    def _place_elsewhere(self, step: RestartStep, failure: StepFailed) -> bool:
        """The replacement's node does not answer: the node is marked unreachable (placement passes
        over it), the replacement (certainly not started) failed with its cards freed, and a new one
        placed on another node; False when no other node has room."""
        new, _ = _replacement(step)
        node = Node.objects.get(name=step.node)
        node_unreachable(node, reason=failure.reason, actor=self.actor)
        self._replica_change(
            new.pk,
            state=Replica.State.FAILED,
            action="fail",
            release=True,
            reason=failure.reason,
            message=f"{new.name} was not started: {failure.reason} Its replacement goes to another node.",
        )
        return self._place_beside(step, step.old_spec)

    def _stop_old(self, step: RestartStep) -> str:
        old, (new, _) = _replaced(step), _replacement(step)
        self._slot_free(step)
        if step.state != RestartStep.State.STOPPING:
            self._set_step(
                step, state=RestartStep.State.STOPPING, reason=f"{new.name} is ready; stopping {old.name}"
            )
        old = Replica.objects.get(pk=old.pk)
        if old.state in Replica.HOLDING_STATES:
            node, _ = replica_placement(old)
            left = self._stop_confirmed(
                old, node, end=Replica.State.STOPPED, why=f"{new.name} replaces it and is ready"
            )
            self.clock.mark(step.pk, "stopped")
            if left:
                return self._finish_step(
                    step,
                    RestartStep.State.SUCCEEDED,
                    f"{old.name} replaced by {new.name} on {step.node} cards {step.cards}, but {old.name}'s stop "
                    f"is not confirmed: {left} It is recorded as stopping and keeps its cards until its agent "
                    "confirms the stop (the reconciler asks again).",
                )
        return self._finish_step(
            step,
            RestartStep.State.SUCCEEDED,
            f"{old.name} replaced by {new.name} on {step.node} cards {step.cards}.",
        )

    # in place

    def _stop_then_start(self, step: RestartStep) -> str:
        old = Replica.objects.get(pk=_replaced(step).pk)
        node = Node.objects.get(name=step.node)
        if old.state in Replica.HOLDING_STATES:
            failure = self._confirm_stop(node, old.name)
            if (
                failure is not None
                and _certainly_not_reached(failure)
                and old.state != Replica.State.STOPPING
            ):
                return self._finish_step(
                    step,
                    RestartStep.State.FAILED,
                    f"{old.name} could not be stopped to free its cards: {failure.message} "
                    f"Nothing was changed: {old.name} is still recorded as {old.state}.",
                )
            if failure is not None:
                self._replica_change(
                    old.pk,
                    state=Replica.State.STOPPING,
                    action="stop_unconfirmed",
                    reason=failure.message,
                    message=f"{old.name} was asked to stop to restart it in place, and its agent did not "
                    f"confirm it: {failure.message} It keeps its cards until the agent does.",
                )
                return self._finish_step(
                    step,
                    RestartStep.State.FAILED,
                    f"{old.name} could not be confirmed stopped to free its cards: {failure.message} It is "
                    "recorded as stopping and keeps its cards until its agent confirms the stop (the "
                    "reconciler asks again); nothing was started in its place.",
                )

        @transaction.atomic
        def swap() -> Replica | None:
            self._hold()
            profile = Profile.objects.select_related("model").get(pk=self.op.profile_id)
            current = Replica.objects.select_for_update().get(pk=old.pk)
            if (
                Shard.objects.filter(card__node=node, card__index__in=step.cards)
                .exclude(replica=current)
                .exists()
            ):
                return None  # another replica took a free card meanwhile
            if current.state in Replica.HOLDING_STATES:
                before = self._replica_after(current, [f"{node.name}#{i}" for i in step.cards])
                current.state = Replica.State.STOPPED
                current.save(update_fields=["state"])
                Shard.objects.filter(replica=current).delete()
                self._audit(
                    action="stop",
                    object_type="replica",
                    object_key=current.name,
                    object_repr=str(current),
                    before=before,
                    after=self._replica_after(current, []),
                    message=self._said(f"stopped {current.name} to restart it in place"),
                )
            return self._record_replacement(
                step,
                profile,
                node,
                list(
                    Card.objects.filter(node=node, index__in=step.cards)
                    .select_related("node")
                    .order_by("index")
                ),
                port=current.port,
                said=lambda new, port: (
                    f"started {new} in place of {current.name} on {node.name} cards "
                    f"{list(step.cards)} port {port}, revision {profile.revision}"
                ),
                reason=lambda new: f"starting {new} in place of {current.name}",
            )

        with self.clock.timed("write: an in-place swap (transaction)"):
            swapped = swap()
        self.clock.mark(step.pk, "placed")
        if swapped is None:
            return self._restore(
                step,
                f"The cards {list(step.cards)} of {node.name} were taken by another "
                "replica before the replacement could start.",
            )
        return self._wait_in_place(step)

    def _wait_in_place(self, step: RestartStep) -> str:
        new, spec = _replacement(step)
        try:
            self._launch_and_wait(step, new, spec)
            self._settle(step, new)
        except StepFailed as exc:
            return self._restore(step, self._stop_replacement(step, exc))
        return self._finish_step(
            step,
            RestartStep.State.SUCCEEDED,
            f"{_replaced(step).name} replaced in place by {new.name} on {step.node} cards {step.cards}.",
        )

    def _restore(self, step: RestartStep, reason: str) -> str:
        """Start the old replica again, with the spec it ran, on its cards."""
        old = Replica.objects.get(pk=_replaced(step).pk)
        if not step.old_spec:
            return self._finish_step(
                step,
                RestartStep.State.FAILED,
                f"{reason} The spec {old.name} ran before is not known, so it was not "
                "started again: start it by hand.",
            )
        node = Node.objects.get(name=step.node)
        self._set_step(step, state=RestartStep.State.STARTING, reason=f"{reason} Starting {old.name} again.")
        if not old.is_live:
            try:
                old = self._replica_change(
                    old.pk,
                    state=Replica.State.STARTING,
                    action="start",
                    hold=(node, list(step.old_spec["cards"])),
                    message=f"started {old.name} again with its previous spec: "
                    "its replacement did not come up",
                )
            except IntegrityError:
                return self._finish_step(
                    step,
                    RestartStep.State.FAILED,
                    f"{reason} {old.name} was not started again: its cards were taken meanwhile.",
                )
        try:
            self._launch_and_wait(step, old, step.old_spec)
        except StepFailed as exc:
            left = ""
            if exc.started:
                left = self._stop_confirmed(
                    old, node, end=Replica.State.FAILED, why=f"it did not come back: {exc.reason}"
                )
            else:
                self._replica_change(
                    old.pk,
                    state=Replica.State.FAILED,
                    action="fail",
                    release=True,
                    reason=exc.reason,
                    message=f"{old.name} did not come back: {exc.reason}",
                )
            held = f" It could not be stopped either: {left}" if left else ""
            return self._finish_step(
                step,
                RestartStep.State.FAILED,
                f"{reason} {old.name} could not be started again either: {exc.reason}{held}",
            )
        return self._finish_step(
            step,
            RestartStep.State.FAILED,
            f"{reason} {old.name} was started again with its previous spec and is ready.",
        )

    # shared

    def _agent_timeout(self) -> float:
        return self.op.ready_timeout + AGENT_DEADLINE_MARGIN

    def _agent(self, node: Node) -> AgentClient:
        return AgentClient.for_node(node)

    def _confirm_stop(self, node: Node, name: str) -> AgentCallFailed | None:
        """Stop a replica on its agent, asking again while the agent does not answer, for at most
        LLMGW_AGENT_ABSENT_SECONDS: None once the agent confirmed the process is gone, else the
        last failure. A refused token or request is not asked again."""
        deadline = time.monotonic() + settings.LLMGW_AGENT_ABSENT_SECONDS
        while True:
            self.lease.tick()
            try:
                with self.clock.timed("agent: stop (answers once the process is gone)"):
                    self._agent(node).stop(name)
            except AgentCallFailed as exc:
                left = deadline - time.monotonic()
                if exc.code in ("agent_token", "agent_refused") or left <= 0:
                    return exc
                time.sleep(min(AWAY_RETRY_SECONDS, left))
                continue
            return None

    def _stop_confirmed(self, replica: Replica, node: Node | None, *, end: str, why: str) -> str:
        """Stop ``replica`` and, once its agent confirmed it, record it ``end`` with its cards freed;
        a stop not confirmed leaves it stopping, holding its cards (the reconciler asks again).
        '' when confirmed, else why not."""
        failure = self._confirm_stop(node, replica.name) if node is not None else None
        if failure is not None:
            self._replica_change(
                replica.pk,
                state=Replica.State.STOPPING,
                action="stop_unconfirmed",
                reason=failure.message,
                message=f"{replica.name} was asked to stop ({why}), and its agent did not confirm it: "
                f"{failure.message} It keeps its cards until the agent does.",
            )
            return failure.message
        self._replica_change(
            replica.pk,
            state=end,
            action="stop" if end == Replica.State.STOPPED else "fail",
            release=True,
            reason=why,
            message=f"stopped {replica.name}: {why}",
        )
        return ""

    def _stop_replacement(self, step: RestartStep, failure: StepFailed) -> str:
        """Stop a replacement that did not come up; record it failed, cards released. Returns the reason."""
        new = Replica.objects.get(pk=_replacement(step)[0].pk)
        reason = failure.reason
        self._set_step(step, reason=reason)  # kept, should this worker die while it cleans up
        if new.state not in Replica.HOLDING_STATES:
            return reason
        if failure.started or new.state == Replica.State.STOPPING:
            left = self._stop_confirmed(
                new,
                Node.objects.get(name=step.node),
                end=Replica.State.FAILED,
                why=f"failed: {failure.reason}",
            )
            if left:
                reason += (
                    f" It could not be stopped either: {left} It is recorded as stopping and keeps its "
                    f"cards on {step.node} until its agent confirms the stop (the reconciler asks again)."
                )
        else:
            self._replica_change(
                new.pk,
                state=Replica.State.FAILED,
                action="fail",
                release=True,
                reason=failure.reason,
                message=f"{new.name} failed: {failure.reason}",
            )
        self._set_step(step, reason=reason)
        return reason

    def _launch_and_wait(self, step: RestartStep, replica: Replica, spec: dict[str, Any]) -> None:
        """PUT the spec (again: harmless) and wait until ready; StepFailed otherwise.

        The agent is asked to answer when the replica's state changes (a long poll of at most
        LLMGW_AGENT_WAIT_SECONDS, and at most a heartbeat's interval so the lease stays fresh), so
        the step learns that its replacement is ready when the agent does. An agent that answers
        at once without a change (one that predates the long poll) is polled every
        LLMGW_OPERATION_POLL_SECONDS instead."""
        node = Node.objects.get(name=step.node)
        agent = self._agent(node)
        self._check_node_policy(node, agent, replica)
        movable = not step.in_place and replica.pk == step.new_replica_id
        moves = 0
        away_since: float | None = None
        while True:
            self.lease.tick()
            try:
                with self.clock.timed("agent: start"):
                    state = agent.start(replica.name, spec)
                self.clock.mark(step.pk, "asked")
                break
            except AgentCallFailed as exc:
                if exc.agent_code == "port_busy" and movable and moves + 1 < PORT_TRIES:
                    # Another program on the node holds the port: a replacement nobody
                    # uses yet may as well take the next one.
                    moves += 1
                    replica, spec = self._move_port(step, replica, spec, node, exc.message)
                    continue
                certain = _certainly_not_reached(exc)
                if movable and exc.code == "agent_down" and certain:
                    # Nothing listens where the agent should: a replacement may go to another node.
                    raise StepFailed(
                        f"{replica.name} could not be started: {exc.message}", started=False, node_down=True
                    ) from None
                away_since = away_since or time.monotonic()
                waited = time.monotonic() - away_since
                if (
                    exc.code in ("agent_token", "agent_refused")
                    or waited >= settings.LLMGW_AGENT_ABSENT_SECONDS
                ):
                    raise StepFailed(
                        f"{replica.name} could not be started: {exc.message}", started=not certain
                    ) from None
                # A node's agent briefly away (restarted, upgraded): asked again within the window.
                time.sleep(min(AWAY_RETRY_SECONDS, settings.LLMGW_AGENT_ABSENT_SECONDS - waited))
        if step.state == RestartStep.State.STARTING:
            self._set_step(
                step, state=RestartStep.State.WAITING, reason=f"waiting for {replica.name} to be ready"
            )
        deadline = time.monotonic() + self.op.ready_timeout
        away_since = None
        recorded = Replica.objects.get(pk=replica.pk).state
        said = ""
        while True:
            self.lease.tick()
            now_state = state.get("state")
            if now_state in ("starting", "loading", "ready") and now_state != recorded:
                self._replica_change(
                    replica.pk,
                    state=now_state,
                    action=now_state,
                    message=f"{replica.name} is {now_state} on {node.name}",
                    memory=dict(state.get("memory") or {}) if now_state == "ready" else None,
                )
                recorded = now_state
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
            reason = str(state.get("reason") or "")
            if reason and reason != said and now_state in ("starting", "loading"):
                said = reason
                self._set_step(step, reason=f"waiting for {replica.name}: {now_state}: {reason}")
            if time.monotonic() >= deadline:
                raise StepFailed(
                    f"{replica.name} was not ready within {self.op.ready_timeout:g} s "
                    f"({now_state}{': ' + reason if reason else ''})."
                )
            left = max(deadline - time.monotonic(), 0.01)
            wait = min(self.wait, left, self.lease.interval)
            asked = time.monotonic()
            try:
                with self.clock.timed("agent: get, waiting for a change (the long poll)"):
                    state = agent.get(replica.name, wait=wait, unless=now_state)
                away_since = None
            except AgentCallFailed as exc:
                away_since = self._agent_away(step, replica, exc, away_since, left)
                continue
            if state.get("state") == now_state:
                self._poll_pause(asked, wait, left)

    def _poll_pause(self, asked: float, wait: float, left: float) -> None:
        """The agent answered a wait of ``wait`` s asked at ``asked`` with no change: when it held
        the answer that long, ask again at once; when it answered sooner (an agent older than the
        long poll), or no wait was asked (LLMGW_AGENT_WAIT_SECONDS=0), poll every
        LLMGW_OPERATION_POLL_SECONDS. (A wait cut short by the heartbeat's interval is not a
        reason to sleep a poll's interval.)"""
        took = time.monotonic() - asked
        if wait <= 0 or took < wait:
            time.sleep(max(min(self.poll, left) - took, 0.0))

    def _agent_away(
        self, step: RestartStep, replica: Replica, exc: AgentCallFailed, since: float | None, left: float
    ) -> float:
        """A poll of ``replica`` failed: wait a little and say so, while its agent has been away for
        less than LLMGW_AGENT_ABSENT_SECONDS (a restart, an upgrade, a blip); StepFailed after that,
        and at once for a refused token or a replica the agent does not know. Returns since when."""
        if exc.code in ("agent_token", "not_found"):
            raise StepFailed(f"{replica.name} could not be watched: {exc.message}") from None
        now = time.monotonic()
        if since is None:
            since = now
            self._set_step(
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

    def _settle(self, step: RestartStep, replica: Replica) -> None:
        """A replacement just ready must stay ready for the operation's settle time (as Kubernetes'
        minReadySeconds) before its old replica is stopped: StepFailed when it falls over meanwhile."""
        settle = self.op.settle_seconds
        if settle <= 0:
            return
        node = Node.objects.get(name=step.node)
        agent = self._agent(node)
        self._set_step(
            step,
            reason=f"{replica.name} is ready; it must stay ready for {settle:g} s before the step goes on",
        )
        began = time.monotonic()
        deadline = began + settle
        away_since = None
        while True:
            self.lease.tick()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            asked = time.monotonic()
            wait = min(self.wait, left, self.lease.interval)
            try:
                state = agent.get(replica.name, wait=wait, unless="ready")
                away_since = None
            except AgentCallFailed as exc:
                away_since = self._agent_away(step, replica, exc, away_since, left)
                continue
            now_state = state.get("state")
            if now_state != "ready":
                said = (
                    describe_failure(state)
                    if now_state == "failed"
                    else str(state.get("reason") or now_state)
                )
                if now_state in ("failed", "stopped"):
                    self._replica_change(
                        replica.pk,
                        state=Replica.State.FAILED,
                        action="fail",
                        release=True,  # the agent says its process is gone
                        reason=said,
                        message=f"{replica.name} fell over {time.monotonic() - began:.1f} s after it was ready",
                    )
                raise StepFailed(
                    f"{replica.name} was ready, then {now_state} {time.monotonic() - began:.1f} s later, within "
                    f"the {settle:g} s it had to stay ready: {said}",
                    started=now_state not in ("failed", "stopped"),
                )
            self._poll_pause(asked, wait, left)

    def _check_node_policy(self, node: Node, agent: AgentClient, replica: Replica) -> None:
        """The node's agent enforces the same launch policy as the control plane:
        otherwise what one allowed the other might refuse (or the reverse), and
        nothing is sent. Asked once a run per node that agrees (an agent changing its policy
        within a run still applies its own to each start)."""
        if node.name in self.same_policy:
            return
        try:
            with self.clock.timed("agent: node (the launch policy's digest)"):
                theirs = agent.node_info().get("policy")
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

    def _move_port(
        self, step: RestartStep, replica: Replica, spec: dict[str, Any], node: Node, why: str
    ) -> tuple[Replica, dict[str, Any]]:
        """The replacement on the next free port: its row, its step's spec and the audit log say so."""

        @transaction.atomic
        def write() -> tuple[Replica, dict[str, Any]]:
            self._hold()
            self._lock_placement()
            row = Replica.objects.select_for_update().get(pk=replica.pk)
            old_port, port = row.port, free_port(node, after=row.port)
            args = list(spec["args"])
            for i in range(len(args) - 1):
                if args[i] == "--port" and args[i + 1] == str(old_port):
                    args[i + 1] = str(port)
            moved = {**spec, "port": port, "args": args}
            before = {"port": old_port}
            row.port = port
            row.save(update_fields=["port"])
            self._set_step(step, spec=moved, reason=f"port {old_port} is taken on {node.name}; trying {port}")
            self._audit(
                action="move_port",
                object_type="replica",
                object_key=row.name,
                object_repr=str(row),
                before=before,
                after={"port": port},
                message=self._said(f"{row.name} moved from port {old_port} to {port} on {node.name}: {why}"),
            )
            return row, moved

        return write()

    def _fail(self, step: RestartStep, reason: str) -> str:
        """Fail a step in flight the way its mode says: stop the replacement, keep or restore the old one."""
        step = self._step(step.pk)
        new = step.new_replica
        if (
            not step.in_place
            and step.state == RestartStep.State.STOPPING
            and new is not None
            and new.state == "ready"
        ):
            return self._stop_old(step)  # the replacement is ready: finishing the step beats rolling it back
        if new is not None and new.state in Replica.HOLDING_STATES:
            reason = self._stop_replacement(step, StepFailed(reason))
        if step.in_place and step.old_replica_id and step.node:
            # Whether or not its agent already stopped it: PUTting its spec again is harmless.
            return self._restore(step, reason)
        return self._finish_step(step, RestartStep.State.FAILED, reason)

    # -- the end -------------------------------------------------------------------------------

    def _give_up(self) -> str:
        op = self.op
        reason = (
            f"Workers took this restart up {op.attempts - 1} time(s) without finishing it (the last was "
            f"{op.worker}); it is stopped here, with its steps in flight rolled back."
        )
        for step_id in op.steps.filter(state__in=RestartStep.IN_FLIGHT_STATES).values_list("pk", flat=True):
            self._fail(self._step(step_id), reason)
        return self._finish(cancelled=False, reason=reason)

    def _finish(self, *, cancelled: bool, reason: str = "") -> str:
        op = self.op
        now = timezone.now()

        @transaction.atomic
        def write() -> str:
            self._hold(alone=True)
            current = RestartOperation.objects.select_for_update().get(pk=op.pk)
            failed_before = RestartStep.objects.filter(operation=op, state=RestartStep.State.FAILED).exists()
            why = (
                "cancelled by request"
                if cancelled
                else "not started: an earlier step failed"
                if failed_before
                else "not started"
            )
            RestartStep.objects.filter(operation=op, state=RestartStep.State.PENDING).update(
                state=RestartStep.State.CANCELLED, finished_at=now, reason=why
            )
            steps = list(
                RestartStep.objects.filter(operation=op).select_related("old_replica").order_by("id")
            )
            ok = [s for s in steps if s.state == RestartStep.State.SUCCEEDED]
            bad = [s for s in steps if s.state == RestartStep.State.FAILED]
            if bad:
                state = RestartOperation.State.PARTLY_FAILED if ok else RestartOperation.State.FAILED
            elif cancelled:
                state = RestartOperation.State.CANCELLED
            else:
                state = RestartOperation.State.SUCCEEDED
            serving = Replica.objects.filter(profile__model_id=op.model_id, state=Replica.State.READY).count()
            summary = f"{len(ok)} of {len(steps)} replica(s) restarted; " + serving_sentence(
                op.model.name, serving
            )
            if bad:
                first = bad[0]
                name = first.old_replica.name if first.old_replica is not None else f"step {first.pk}"
                summary += f"; {name}: {first.reason.splitlines()[0] if first.reason else 'failed'}"
                if len(bad) > 1:
                    summary += f" (and {len(bad) - 1} more failed)"
            if cancelled:
                summary += "; the rest cancelled on request"
            summary = summary.rstrip(".") + "."
            text = f"{reason} {summary}" if reason else summary
            before = {"state": current.state}
            current.state, current.finished_at, current.reason, current.heartbeat_at = state, now, text, now
            current.serving_after = serving
            current.save(update_fields=["state", "finished_at", "reason", "heartbeat_at", "serving_after"])
            self._audit(
                action="restart_finish",
                object_type="restart",
                object_key=str(op.pk),
                object_repr=str(current),
                before=before,
                after={"state": state, "reason": text, "serving": serving},
                message=self._said(f"restart #{op.pk} {state.replace('_', ' ')}: {text}"),
            )
            return state

        try:
            state = write()
        except OperationLost:
            return "lost"
        log.info("restart #%s: %s", op.pk, state)
        return state
