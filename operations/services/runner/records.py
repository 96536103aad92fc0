"""The rows a run writes, each with its audit entry, and why a step failed.

Every write first holds the operation's row where worker, epoch and state are
still this run's (``Lease.hold``, in the write's own transaction): a worker
taken over writes nothing more, and nothing is written after the operation
ended. The steps' writes hold that row together, not one at a time (on
PostgreSQL ``FOR KEY SHARE``: steps side by side write side by side, a claim
still waits for every write under way, and the heartbeat for none); the end, which changes the row
itself, holds it alone (``finishing.py``). Every row written here is audited
in the same transaction, by the worker, with the operator who asked named in
the message. A reason kept on a step or a replica has the profile's secrets
masked: an engine's log tail or an agent's sentence may echo one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.services import audit_record, audit_records, snapshot
from base.actor import Actor
from base.db import update_rows
from base.secrets import profile_secrets, redact
from catalog.models import Card, Node, Profile, Replica, Shard
from catalog.services.fit import planned_with_release, profile_memory
from operations.models import RestartOperation, RestartStep
from operations.services.lease import Lease
from operations.services.placement import free_port, lock_placement, replica_name
from operations.services.runner.together import BatchFailed, Together
from operations.services.specs import replica_spec
from operations.services.timing import RunClock

log = logging.getLogger("operations.restart")

# The agent's own deadline is a backstop for a worker that died: ours comes first.
AGENT_DEADLINE_MARGIN = 30.0


class StepFailed(Exception):
    """A step failed, for ``reason``."""

    def __init__(
        self, reason: str, *, started: bool = True, node_down: bool = False, cancelled: bool = False
    ):
        super().__init__(reason)
        self.reason = reason
        self.started = started  # False: the agent certainly did not start the replacement
        self.node_down = node_down  # its node's agent refused the connection: another node may do
        self.cancelled = cancelled  # the restart was cancelled while a group started (groups.py)


def replaced(step: RestartStep) -> Replica:
    """The replica the step replaces, as the step loaded it."""
    if step.old_replica is None:
        raise StepFailed("The replica this step restarts was removed from the catalog.", started=False)
    return step.old_replica


def replacement(step: RestartStep) -> tuple[Replica, dict[str, Any]]:
    """The step's replacement and the spec recorded for it."""
    if step.new_replica is None or step.spec is None:
        raise StepFailed(
            "The replacement recorded for this step was removed from the catalog.", started=False
        )
    return step.new_replica, step.spec


def replica_after(replica: Replica, cards: list[str]) -> dict[str, Any]:
    """A replica as its audit entry shows it, with the cards it holds."""
    return {**snapshot(replica), "cards": cards}


def engine_version(profile: Profile, node: Node) -> str:
    """The release a replacement starts with: what its node's agent reported installed (placement
    refused a node without the profile's release); "" where the node never said."""
    return str((node.engines or {}).get(profile.engine, "")) if isinstance(node.engines, dict) else ""


@dataclass(frozen=True)
class ReplicaChange:
    """One replica's change asked of ``Records.replica_change``."""

    replica_id: int
    state: str
    action: str
    message: str
    release: bool
    hold: tuple[Node, list[int]] | None
    hold_ranks: list[tuple[int, Node, list[int]]] | None
    memory: dict[str, Any] | None
    reason: str | None
    step: RestartStep | None
    step_fields: dict[str, Any] | None


class Records:
    """One run's writes: its steps, its replicas and their cards, each under the lease's fence."""

    def __init__(self, op: RestartOperation, lease: Lease, actor: Actor, clock: RunClock):
        self.op = op
        self.lease = lease
        self.actor = actor
        self.clock = clock
        self.secrets = [
            secret
            for profile in Profile.objects.filter(model_id=op.model_id)
            for secret in profile_secrets(profile.engine, profile.env or {})
        ]
        # The profiles as they were at a revision, from the audit log (``specs.running_spec``):
        # read once for the run's steps, whose old replicas mostly ran the same one.
        self.profiles_then: dict[tuple[int, int], dict[str, Any] | None] = {}
        self._replica_writes: Together[ReplicaChange, Replica] = Together()

    def agent_timeout(self) -> float:
        """The deadline a spec gives its agent to have the replica ready."""
        return self.op.ready_timeout + AGENT_DEADLINE_MARGIN

    # -- locks (timed: operations/services/timing.py) ------------------------------------------

    def hold(self, *, alone: bool = False) -> None:
        """Hold the operation's row for the caller's transaction (``Lease.hold``): OperationLost
        once it is no longer this run's."""
        with self.clock.timed("wait: the operation's row (the lease's fence)"):
            self.lease.hold(alone=alone)

    def lock_placement(self) -> None:
        with self.clock.timed("wait: the placement lock"):
            lock_placement()

    def audit(self, **entry: Any) -> None:
        with self.clock.timed("audit_record (waits for the chain's lock)"):
            audit_record(actor=self.actor, **entry)

    def audit_all(self, entries: list[dict[str, Any]]) -> None:
        """Write ``entries`` (a batch of placements', ``runner/placing.py``) in the caller's
        transaction, the chain's lock taken once: held for one read and one insert to the commit."""
        if entries:
            with self.clock.timed("audit_records (a batch of placements; waits for the chain's lock)"):
                audit_records(entries, actor=self.actor)

    def said(self, text: str) -> str:
        """An audit message, naming the restart and the operator who asked for it."""
        return f"{text} (restart #{self.op.pk} of {self.op.model.name}, asked by {self.op.requested_by_name})"

    # -- steps -----------------------------------------------------------------------------------

    def step(self, step_id: int) -> RestartStep:
        return RestartStep.objects.select_related("old_replica", "new_replica").get(pk=step_id)

    def set_step(self, step: RestartStep, **fields: Any) -> None:
        with self.clock.timed("write: a step's state (transaction)"), transaction.atomic():
            self.hold()
            self._write_step(step, fields)
        self._kept_on(step, fields)

    def _write_step(self, step: RestartStep, fields: dict[str, Any]) -> None:
        """In the caller's transaction, under the fence."""
        RestartStep.objects.filter(pk=step.pk).update(**self._redacted(fields))

    def _redacted(self, fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` (a step's) with its reason's secrets masked, in place: an engine's log tail
        or an agent's sentence may echo a secret of the profile's."""
        if isinstance(fields.get("reason"), str):
            fields["reason"] = redact(fields["reason"], self.secrets)
        return fields

    @staticmethod
    def _kept_on(step: RestartStep, fields: dict[str, Any]) -> None:
        """Once committed: the step object says what its row says."""
        for name, value in fields.items():
            setattr(step, name, value)

    def finish_step(self, step: RestartStep, state: str, reason: str) -> str:
        self.set_step(step, **self.finished(state, reason))
        self.said_finished(step)
        return state

    def finished(self, state: str, reason: str) -> dict[str, Any]:
        """A step's fields once it ends ``state`` for ``reason`` (``finish_step``, or a replica's
        write that ends its step in the same transaction: ``replica_change(step=...)``)."""
        return {"state": state, "reason": redact(reason, self.secrets), "finished_at": timezone.now()}

    def said_finished(self, step: RestartStep) -> None:
        log.info("restart #%s step %s: %s: %s", self.op.pk, step.pk, step.state, step.reason)

    # -- replicas --------------------------------------------------------------------------------

    def replica_change(
        self,
        replica_id: int,
        *,
        state: str,
        action: str,
        message: str,
        release: bool = False,
        hold: tuple[Node, list[int]] | None = None,
        hold_ranks: list[tuple[int, Node, list[int]]] | None = None,
        memory: dict[str, Any] | None = None,
        reason: str | None = None,
        step: RestartStep | None = None,
        step_fields: dict[str, Any] | None = None,
    ) -> Replica:
        """Set a replica's state, release or take its cards (``hold``: on one node; ``hold_ranks``:
        each rank's on its node), and audit it, in one transaction; with ``memory`` (the agent's
        report, once ready), keep what its cards were planned to hold beside what the engine and
        card reported. ``step_fields``: ``step``'s own change that goes with the replica's (its
        state or reason), written in the same transaction rather than one of its own.

        The writes other step threads ask for meanwhile go in the same transaction (``Together``,
        as the placements do): at sixteen steps at once a wave's replacements turn ready, their
        old replicas drain and stop within a second, each write holding the audit chain's lock,
        which every audited write of the fleet waits for, the next wave's placements included.
        Written together, they take that lock once a batch. A batch that fails is written again
        one change a transaction, so one that cannot be written fails its own step only; a caller
        already in a transaction has its change written in it, alone."""
        asked = ReplicaChange(
            replica_id, state, action, message, release, hold, hold_ranks, memory, reason, step, step_fields
        )
        with self.clock.timed("write: a replica's state (transaction)"):
            if connection.in_atomic_block:
                written = self._write_replicas([asked])[0]
            else:
                try:
                    written = self._replica_writes.do(asked, self._write_replicas)
                except BatchFailed:
                    written = self._write_replicas([asked])[0]
        if step is not None and step_fields:
            self._kept_on(step, step_fields)
        return written

    def _write_replicas(self, batch: list[ReplicaChange]) -> list[Replica]:
        """Each change of ``batch`` in one transaction, its outcome in the batch's order; more than
        one and failing: BatchFailed."""
        try:
            return self._write_together(batch)
        except Exception as exc:
            if len(batch) == 1:
                raise
            raise BatchFailed(str(exc)) from exc

    @transaction.atomic
    def _write_together(self, batch: list[ReplicaChange]) -> list[Replica]:
        """The batch's changes in one transaction, with the statements of one change: the
        replicas locked in one read (in their ids' order, as every batch locks them, so that two
        never wait on each other in a circle) with their profiles and models (the audit snapshot
        names them), their cards in one, their rows in one update, the cards released in one
        delete, the steps' changes in one update each kind, the audit entries last in one insert
        (the chain's lock held from there to the commit only). A change that takes cards (in
        place) writes them as it comes."""
        self.hold()
        ids = sorted({c.replica_id for c in batch})
        rows = {
            r.pk: r
            for r in Replica.objects.select_for_update(of=("self",))
            .select_related("profile__model")
            .filter(pk__in=ids)
            .order_by("pk")
        }
        gone = [pk for pk in ids if pk not in rows]
        if gone:
            raise Replica.DoesNotExist(f"Replica {gone[0]} is no longer in the catalog.")
        held: dict[int, list[str]] = {pk: [] for pk in ids}
        for shard in Shard.objects.filter(replica_id__in=ids).select_related("card__node"):
            held[shard.replica_id].append(str(shard.card))
        written = _Written(rows)
        # In the replicas' order; a replica's changes in the order they were asked.
        for i in sorted(range(len(batch)), key=lambda i: batch[i].replica_id):
            self._apply(batch[i], rows[batch[i].replica_id], held, written)
        written.flush()
        with self.clock.timed("audit_records (replicas' writes made together; waits for the chain's lock)"):
            audit_records(written.entries, actor=self.actor)
        self.clock.add("replicas' writes made in one transaction (n: transactions)", len(batch), unit="")
        return [rows[c.replica_id] for c in batch]

    def _apply(
        self, change: ReplicaChange, replica: Replica, held: dict[int, list[str]], written: _Written
    ) -> None:
        """``change`` to ``replica`` in memory, its writes noted in ``written`` (cards taken are
        written at once), its audit entry kept."""
        before = replica_after(replica, held[replica.pk])
        fields = {"state"}
        if replica.state != change.state:
            replica.state, replica.state_changed_at = change.state, timezone.now()
            fields.add("state_changed_at")
        if change.reason is not None:
            replica.reason = redact(change.reason, self.secrets)
            fields.add("reason")
        if change.memory is not None:
            profile = written.profile(replica.profile_id)
            planned = profile_memory(profile, profile.model)
            replica.planned_memory = planned_with_release(profile, planned)
            replica.measured_memory = change.memory
            replica.measured_at = timezone.now() if change.memory else None
            fields |= {"planned_memory", "measured_memory", "measured_at"}
        written.fields |= fields
        if change.release:
            written.released.add(replica.pk)
            held[replica.pk] = []
        takes = list(change.hold_ranks or [])
        if change.hold is not None:  # on one node, as rank 0: what it held before is let go
            takes.insert(0, (0, *change.hold))
            held[replica.pk] = []
        if takes:
            written.release_now(replica.pk)  # a release asked before, then the cards taken
            for rank, node, indices in takes:
                cards = list(Card.objects.filter(node=node, index__in=indices).select_related("node"))
                Shard.objects.bulk_create(Shard(replica=replica, card=c, rank=rank) for c in cards)
                held[replica.pk] += [str(c) for c in cards]
        if change.step is not None and change.step_fields:
            written.step(change.step, self._redacted(change.step_fields))
        written.entries.append(
            dict(
                action=change.action,
                object_type="replica",
                object_key=replica.name,
                object_repr=str(replica),
                before=before,
                after=replica_after(replica, held[replica.pk]),
                message=self.said(change.message),
            )
        )

    def record_replacement(
        self,
        step: RestartStep,
        profile: Profile,
        node: Node,
        cards: list[Card],
        *,
        port: int,
        said: Callable[[str, int], str],
        reason: Callable[[str], str],
        locked: bool = False,
        **fields: Any,
    ) -> Replica:
        """In the caller's transaction, record the step's replacement on ``cards`` and ``port``
        of ``node`` (rolling beside the old replica, or in place on its cards), with the spec it
        is to be sent, audited with ``said(name, port)``; the step is set starting there, with
        ``reason(name)`` and ``fields``. ``locked``: the transaction holds the placement lock."""
        spec = replica_spec(
            profile, port=port, cards=[c.index for c in cards], ready_timeout=self.agent_timeout()
        )
        new = Replica.objects.create(
            name=replica_name(profile.model, step, locked=locked),
            profile=profile,
            port=port,
            state=Replica.State.STARTING,
            revision=profile.revision,
            engine_version=engine_version(profile, node),
        )
        Shard.objects.bulk_create(Shard(replica=new, card=c) for c in cards)
        self.audit(
            action="start",
            object_type="replica",
            object_key=new.name,
            object_repr=str(new),
            after=replica_after(new, [str(c) for c in cards]),
            message=self.said(said(new.name, port)),
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

    def stop_for_in_place(
        self, replica: Replica, node: Node, cards: list[int], *, reason: str, held: list[str] | None = None
    ) -> None:
        """In the caller's transaction, with ``replica`` locked: record it stopped, its cards freed
        for its replacement in place (its agent confirmed the stop), and why (with how its drain
        went, as its agent said). ``held``: every card it holds ("node#index"), a group's on each
        of its nodes; ``cards`` of ``node`` otherwise."""
        before = replica_after(replica, held if held is not None else [f"{node.name}#{i}" for i in cards])
        replica.state, replica.state_changed_at = Replica.State.STOPPED, timezone.now()
        replica.reason = redact(reason, self.secrets)
        replica.save(update_fields=["state", "state_changed_at", "reason"])
        Shard.objects.filter(replica=replica).delete()
        self.audit(
            action="stop",
            object_type="replica",
            object_key=replica.name,
            object_repr=str(replica),
            before=before,
            after=replica_after(replica, []),
            message=self.said(f"{replica.name} {reason}"),
        )

    def move_port(
        self, step: RestartStep, replica: Replica, spec: dict[str, Any], node: Node, why: str
    ) -> tuple[Replica, dict[str, Any]]:
        """The replacement on the next free port: its row, its step's spec and the audit log say so."""

        @transaction.atomic
        def write() -> tuple[Replica, dict[str, Any]]:
            self.hold()
            self.lock_placement()
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
            self.set_step(step, spec=moved, reason=f"port {old_port} is taken on {node.name}; trying {port}")
            self.audit(
                action="move_port",
                object_type="replica",
                object_key=row.name,
                object_repr=str(row),
                before=before,
                after={"port": port},
                message=self.said(f"{row.name} moved from port {old_port} to {port} on {node.name}: {why}"),
            )
            return row, moved

        return write()


class _Written:
    """What a batch of replica changes writes once all are applied: the replicas' rows in one
    update of every field any of them changed (the others keep the values just read, under their
    rows' locks), the cards released in one delete, the steps' changes in one update for each set
    of fields, and the audit entries."""

    def __init__(self, rows: dict[int, Replica]):
        self.rows = rows
        self.fields: set[str] = set()
        self.released: set[int] = set()
        self.entries: list[dict[str, Any]] = []
        self._steps: dict[frozenset[str], dict[int, RestartStep]] = {}
        self._profiles: dict[int, Profile] = {}

    def profile(self, pk: int) -> Profile:
        if pk not in self._profiles:
            self._profiles[pk] = Profile.objects.select_related("model", "gpu_class").get(pk=pk)
        return self._profiles[pk]

    def release_now(self, replica_id: int) -> None:
        if replica_id in self.released:
            Shard.objects.filter(replica_id=replica_id).delete()
            self.released.discard(replica_id)

    def step(self, step: RestartStep, fields: dict[str, Any]) -> None:
        # A row of its own with only these fields: the step object is told once they are committed.
        self._steps.setdefault(frozenset(fields), {})[step.pk] = RestartStep(pk=step.pk, **fields)

    def flush(self) -> None:
        update_rows(Replica, self.rows.values(), sorted(self.fields))
        if self.released:
            Shard.objects.filter(replica_id__in=sorted(self.released)).delete()
        for fields, steps in self._steps.items():
            update_rows(RestartStep, steps.values(), sorted(fields))
