"""Restarts through the node agents: start an operation, cancel it, and run it.

``restart_start`` and ``operation_cancel`` are what the edges call (pages, API,
command, the resize). ``run_operation`` is the body of the worker's task: it
claims the operation (see ``catalog/tasks.py`` for claiming, heartbeats and
takeover) and runs its steps, each one replica:

Rolling (the default, where a node has room): the replacement is placed on
free cards (best fit: the ready node with the fewest free cards of the
profile's class that still holds it; port: the highest one in use on that
host + 1, from ``LLMGW_REPLICA_PORT_BASE``), recorded with its shards, PUT to
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

Every row written here is audited in the same transaction, by the worker,
with the operator who asked named in the message.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Max
from django.utils import timezone
from llmgw_policy import default_policy, source_refusal

from catalog.actor import Actor, acting_as, current_actor
from catalog.agents import AgentClient, AgentError, describe_failure
from catalog.errors import DomainError, conflict, not_found
from catalog.models import (
    AuditEntry,
    Card,
    Node,
    Profile,
    Replica,
    RestartOperation,
    RestartStep,
    ServedModel,
    Shard,
)
from catalog.models.serving import stale_replicas_q
from catalog.planning import engines
from catalog.secrets import profile_secrets, redact
from catalog.services.audit import audit_record, snapshot

if TYPE_CHECKING:
    from catalog.tasks import Lease

log = logging.getLogger("catalog.restart")

MAX_PARALLEL = 32
MAX_READY_TIMEOUT = 24 * 3600.0
# The agent's own deadline is a backstop for a worker that died: ours comes first.
AGENT_DEADLINE_MARGIN = 30.0
# Polls of a replica that fail in a row before its step fails (a blip is not a failure).
POLL_ERRORS_ALLOWED = 3
# A replacement whose port another program holds moves up a port, this many times at most.
PORT_TRIES = 5
_PLACEMENT_LOCK_KEY = (
    0x6C6C7270  # "llrp": one placement at a time, so two steps never pick the same cards/port
)

Op = RestartOperation
Step = RestartStep


# --- specs ------------------------------------------------------------------------------------


def build_spec(
    *,
    engine: str,
    tp: int,
    args: Iterable[str],
    env: dict[str, str],
    model: ServedModel,
    port: int,
    cards: list[int],
    ready_timeout: float,
) -> dict[str, Any]:
    """The PUT /v1/replicas/{id} body: the launch policy's arguments, then the
    profile's. A profile the launch policy refuses now (it was saved before a
    rule changed) is refused here with the reason, and nothing is sent."""
    eng = engines.engine(engine)
    check_launchable(model=model, engine=engine, args=list(args), env=env)
    return {
        "engine": engine,
        "model": model.name,
        "args": engines.launch_args(
            eng, source=model.source, port=port, model=model.name, tp=tp, args=list(args)
        ),
        "env": dict(env),
        "cards": list(cards),
        "port": port,
        "ready_timeout": ready_timeout,
    }


def check_launchable(*, model: ServedModel, engine: str, args: list[str], env: dict[str, str]) -> None:
    """The model's source and the profile's arguments and environment pass the
    launch policy as it is now; ``refused_source`` or ``refused_arg`` saying
    why (and what to change) otherwise."""
    bad_source = source_refusal(model.source, settings.LLMGW_MODEL_ROOTS)
    if bad_source is not None:
        raise DomainError("refused_source", f"{model.name} cannot be started: {bad_source.sentence}")
    refusals = engines.refusals(engines.engine(engine), args, env, context_max=model.context_length)
    if refusals:
        raise DomainError(
            "refused_arg",
            f"{model.name} cannot be started as its profile stands: "
            + " ".join(r.sentence for r in refusals)
            + " Change the profile first (it was saved before the launch policy said so).",
        )


def profile_spec(
    profile: Profile, *, port: int, cards: list[int], ready_timeout: float = 600
) -> dict[str, Any]:
    """The spec of a replica of ``profile`` as it is now."""
    return build_spec(
        engine=profile.engine,
        tp=profile.tp,
        args=profile.args,
        env=profile.env,
        model=profile.model,
        port=port,
        cards=cards,
        ready_timeout=ready_timeout,
    )


def replica_placement(replica: Replica) -> tuple[Node | None, list[int]]:
    """The node a replica runs on and its card indices there (None, [] when it holds no cards)."""
    shards = list(Shard.objects.filter(replica=replica).select_related("card__node").order_by("card__index"))
    if not shards:
        return None, []
    node = shards[0].card.node
    return node, [s.card.index for s in shards if s.card.node_id == node.pk]


def running_spec(
    replica: Replica, *, node_cards: list[int] | None = None, ready_timeout: float = 600
) -> dict[str, Any] | None:
    """The spec ``replica`` runs, as well as the catalog knows it; None when it does not.

    From the restart step that started it (exact); else from its profile when
    it runs the current revision; else from the profile as it was at the
    replica's revision, which the audit log keeps (every profile save records
    the whole profile).
    """
    started = (
        RestartStep.objects.filter(new_replica=replica)
        .exclude(spec=None)
        .order_by("-id")
        .values_list("spec", flat=True)
        .first()
    )
    if started:
        return started
    profile = Profile.objects.select_related("model").get(pk=replica.profile_id)
    cards = node_cards if node_cards is not None else replica_placement(replica)[1]
    if replica.revision == profile.revision:
        return profile_spec(profile, port=replica.port, cards=cards, ready_timeout=ready_timeout)
    # By the snapshot's own fields, whatever the entry's key looks like.
    entry = (
        AuditEntry.objects.filter(
            object_type="profile",
            after__model=profile.model.name,
            after__name=profile.name,
            after__revision=replica.revision,
        )
        .order_by("-id")
        .first()
    )
    if entry is None or not isinstance(entry.after, dict):
        return None
    then = entry.after
    try:
        return build_spec(
            engine=then["engine"],
            tp=int(then["tp"]),
            args=then.get("args") or [],
            env=then.get("env") or {},
            model=profile.model,
            port=replica.port,
            cards=cards,
            ready_timeout=ready_timeout,
        )
    except (KeyError, TypeError, ValueError, DomainError):
        return None


# --- starting and cancelling ----------------------------------------------------------------


def _operation_after(op: Op, names: list[str]) -> dict[str, Any]:
    return {
        "model": op.model.name,
        "profile": op.profile.name,
        "state": op.state,
        "mode": op.mode,
        "in_place": op.in_place,
        "max_parallel": op.max_parallel,
        "ready_timeout": op.ready_timeout,
        "requested_by": op.requested_by_name,
        "via": op.via,
        "replicas": names,
    }


def _chosen_replicas(model: ServedModel, names: list[str] | None) -> list[Replica]:
    live = Replica.objects.filter(profile__model=model, state__in=Replica.LIVE_STATES).select_related(
        "profile"
    )
    if names:
        chosen = []
        for name in dict.fromkeys(names):
            replica = Replica.objects.select_related("profile__model").filter(name=name).first()
            if replica is None:
                raise not_found(f"No replica {name!r} in the catalog.")
            if replica.profile.model_id != model.pk:
                raise DomainError(
                    "other_model", f"Replica {name} serves {replica.profile.model.name}, not {model.name}."
                )
            if not replica.is_live:
                raise conflict(
                    "not_live",
                    f"Replica {name} is {replica.state}: only starting, loading or ready "
                    "replicas are restarted.",
                )
            chosen.append(replica)
        return chosen
    chosen = list(live.filter(stale_replicas_q()).order_by("name"))
    if not chosen:
        count = live.count()
        raise conflict(
            "nothing_to_restart",
            f"{model.name} has no live replica to restart."
            if not count
            else f"All {count} live replica(s) of {model.name} run their profile's current revision: name the ones "
            'to restart anyway (--replica NAME, or "replicas" in the API).',
        )
    return chosen


def _check_restartable(model: ServedModel, profile: Profile) -> None:
    engines.engine(profile.engine)  # unknown_engine, with the known ones
    check_launchable(model=model, engine=profile.engine, args=list(profile.args), env=dict(profile.env))
    if profile.gpu_class_id is None:
        raise DomainError(
            "cpu_only",
            f"{model.name}'s {profile.name} profile runs on CPUs: restarts go through a "
            "node's agent and need cards; give the profile a GPU class first.",
        )
    if max(profile.nodes, 1) > 1 or max(profile.pp, 1) > 1:
        raise DomainError(
            "multi_node",
            f"{model.name}'s {profile.name} profile spreads a replica over several "
            "nodes or pipeline stages, which restarts do not handle yet.",
        )


def _busy(op: Op) -> DomainError:
    return conflict(
        "busy",
        f"Restart #{op.pk} of {op.model.name} is {op.state.replace('_', ' ')}: wait until it "
        "ends, or cancel it, then try again.",
    )


def restart_start(
    *,
    model_name: str,
    replicas: list[str] | None = None,
    in_place: bool | None = None,
    max_parallel: int = 1,
    ready_timeout: float = 600,
    actor: Actor | None = None,
) -> RestartOperation:
    """Start restarting ``model_name``'s stale replicas (or the live ones named).

    ``in_place``: True stops each replica before its replacement starts; False
    restarts rolling only (a step without room beside fails); None rolls where
    there is room and goes in place where not. Creates the operation and its
    steps and audits it; the worker's task is enqueued when the transaction
    commits, so this may run inside a caller's transaction (the resize's).
    Refusals: not_found, other_model, not_live, nothing_to_restart, busy,
    cpu_only, multi_node, several_profiles, unknown_engine, invalid.
    """
    if (
        isinstance(max_parallel, bool)
        or not isinstance(max_parallel, int)
        or not 1 <= max_parallel <= MAX_PARALLEL
    ):
        raise DomainError(
            "invalid", f"max_parallel must be a whole number from 1 to {MAX_PARALLEL}, not {max_parallel!r}."
        )
    if (
        isinstance(ready_timeout, bool)
        or not isinstance(ready_timeout, int | float)
        or not 0 < ready_timeout <= MAX_READY_TIMEOUT
    ):
        raise DomainError(
            "invalid",
            f"ready_timeout must be a number of seconds above 0 and at most "
            f"{MAX_READY_TIMEOUT:g}, not {ready_timeout!r}.",
        )
    actor = actor or current_actor()
    with transaction.atomic():
        # Held until commit: a second restart of the model waits here, then sees this one and is refused.
        model = ServedModel.objects.select_for_update().filter(name=model_name).first()
        if model is None:
            raise not_found(f"No model {model_name!r} in the catalog.")
        active = Op.objects.filter(model=model, state__in=Op.ACTIVE_STATES).select_related("model").first()
        if active is not None:
            raise _busy(active)
        chosen = _chosen_replicas(model, replicas)
        profile_ids = {r.profile_id for r in chosen}
        if len(profile_ids) > 1:
            raise DomainError(
                "several_profiles",
                f"The replicas named run {len(profile_ids)} different profiles "
                f"of {model.name}: restart one profile's replicas at a time.",
            )
        profile = Profile.objects.select_related("model", "gpu_class").get(pk=profile_ids.pop())
        _check_restartable(model, profile)
        op = Op(
            model=model,
            profile=profile,
            in_place=in_place,
            max_parallel=max_parallel,
            ready_timeout=float(ready_timeout),
            requested_by=actor.resolved_user,
            requested_by_name=actor.display_name[:150],
            via=actor.via,
        )
        try:
            with transaction.atomic():
                op.save()
        except IntegrityError:  # the one-active-restart constraint, should a writer slip past the lock
            raise _busy(Op.objects.filter(model=model, state__in=Op.ACTIVE_STATES).first() or op) from None
        RestartStep.objects.bulk_create(RestartStep(operation=op, old_replica=r) for r in chosen)
        names = [r.name for r in chosen]
        audit_record(
            action="restart_start",
            object_type="restartoperation",
            object_key=str(op.pk),
            object_repr=str(op),
            after=_operation_after(op, names),
            actor=actor,
            message=f"restart #{op.pk} of {model.name} asked by {op.requested_by_name}: {len(names)} replica(s) "
            f"({', '.join(names)}), {op.mode}, {max_parallel} at a time, {ready_timeout:g} s to be ready",
        )
        from catalog.tasks import enqueue_restart

        # robust: should the enqueue fail, the restart stays queued and the sweep enqueues it.
        transaction.on_commit(partial(enqueue_restart, op.pk), robust=True)
    return op


def operation_cancel(*, operation_id: int, actor: Actor | None = None) -> RestartOperation:
    """Ask a restart to stop: the steps in flight finish, the others are cancelled.

    A queued operation (no worker has it yet) is cancelled at once. Asking
    twice is harmless. Refusals: not_found, finished.
    """
    actor = actor or current_actor()
    with transaction.atomic():
        op = Op.objects.select_for_update().select_related("model", "profile").filter(pk=operation_id).first()
        if op is None:
            raise not_found(f"No restart operation #{operation_id}.")
        if not op.is_active:
            raise conflict(
                "finished",
                f"Restart #{op.pk} of {op.model.name} has already ended "
                f"({op.state.replace('_', ' ')}): there is nothing to cancel.",
            )
        if op.cancel_requested:
            return op
        before = {"state": op.state, "cancel_requested": False}
        op.cancel_requested = True
        now = timezone.now()
        if op.state == Op.State.QUEUED:
            op.state, op.finished_at = Op.State.CANCELLED, now
            op.reason = f"Cancelled by {actor.display_name} before a worker started it."
            op.steps.filter(state=Step.State.PENDING).update(
                state=Step.State.CANCELLED, finished_at=now, reason="cancelled before it started"
            )
        op.save(update_fields=["cancel_requested", "state", "finished_at", "reason"])
        audit_record(
            action="restart_cancel",
            object_type="restartoperation",
            object_key=str(op.pk),
            object_repr=str(op),
            before=before,
            after={"state": op.state, "cancel_requested": True},
            actor=actor,
            message=f"restart #{op.pk} of {op.model.name} (asked by {op.requested_by_name}) cancelled by "
            f"{actor.display_name}"
            + ("" if op.state == Op.State.CANCELLED else ": the steps in flight finish, no new one starts"),
        )
    return op


# --- running ------------------------------------------------------------------------------------


def run_operation(operation_id: int, *, worker: str | None = None) -> str:
    """Claim the operation and run it to its end; returns its final state.

    "not_claimed" when it is finished, or held by a live worker; "lost" when
    another worker took it over while this one ran (this one then stops
    without touching anything more).
    """
    from catalog.tasks import Lease, claim, worker_name

    worker = worker or worker_name()
    actor = Actor(via="worker", name=worker, request_id=f"restart-{operation_id}")
    with acting_as(actor):
        op = claim(operation_id, worker)
        if op is None:
            return "not_claimed"
        log.info("%s: running restart #%s (attempt %s)", worker, op.pk, op.attempts)
        try:
            return _Run(op, Lease(op.pk, worker), actor).run()
        except OperationLost:
            return "lost"


class OperationLost(Exception):
    """Another worker holds the operation now: this one stops without touching anything more."""


_Lost = OperationLost


class _StepFailed(Exception):
    def __init__(self, reason: str, *, started: bool = True):
        super().__init__(reason)
        self.reason = reason
        self.started = started  # False: the agent certainly did not start the replacement


def _threads_can_share_the_database() -> bool:
    """False for an in-memory SQLite database (the tests'): its connections
    lock whole tables, so steps in threads would trip over each other."""
    name = str(connection.settings_dict.get("NAME") or "")
    return connection.vendor != "sqlite" or not (name == ":memory:" or "mode=memory" in name)


def _lock_placement() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_PLACEMENT_LOCK_KEY])
    # SQLite: write transactions are IMMEDIATE and run one at a time.


def _host(node: Node) -> str:
    return (urlsplit(node.agent_url).hostname or node.agent_url).lower()


def _free_port(node: Node, *, after: int | None = None) -> int:
    """The highest port live replicas use on the node's host, + 1 (from the base),
    and above ``after`` when given (a port found taken by another program).

    Nodes whose agents share a host (the demo, the tests) share its ports.
    """
    same_host = [n.pk for n in Node.objects.all() if _host(n) == _host(node)]
    highest = Replica.objects.filter(
        state__in=Replica.LIVE_STATES, shards__card__node__in=same_host
    ).aggregate(top=Max("port"))["top"]
    base = settings.LLMGW_REPLICA_PORT_BASE
    port = base if highest is None or highest < base else highest + 1
    return port if after is None else max(port, after + 1)


def _best_fit(profile: Profile, *, replacing: Replica | None = None) -> tuple[Node, list[Card]] | None:
    """Free cards of the profile's class for one replica: on the ready node
    with the fewest free cards that still has enough (ties by name), but first
    on a node that holds none of the model's other live replicas, so that one
    node going down does not take every replica of a model with it."""
    need = profile.cards
    siblings = set(
        Shard.objects.filter(
            replica__profile__model_id=profile.model_id, replica__state__in=Replica.LIVE_STATES
        )
        .exclude(replica=replacing)
        .values_list("card__node_id", flat=True)
    )
    free: dict[int, list[Card]] = {}
    for card in (
        Card.objects.filter(
            gpu_class_id=profile.gpu_class_id, node__state=Node.State.READY, shard__isnull=True
        )
        .select_related("node")
        .order_by("node__name", "index")
    ):
        free.setdefault(card.node_id, []).append(card)
    fits = [cards for cards in free.values() if len(cards) >= need]
    if not fits:
        return None
    best = min(fits, key=lambda cards: (cards[0].node_id in siblings, len(cards), cards[0].node.name))
    return best[0].node, best[:need]


def _replica_name(model: ServedModel, step: Step) -> str:
    suffix = f"-r{step.pk}"
    name = model.name[: 128 - len(suffix) - 3] + suffix
    n = 1
    candidate = name
    while Replica.objects.filter(name=candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate


class _Run:
    """One worker's run of a claimed operation."""

    def __init__(self, op: Op, lease: Lease, actor: Actor):
        self.op = Op.objects.select_related("model", "profile").get(pk=op.pk)
        self.lease = lease
        self.actor = actor
        self.poll = settings.LLMGW_OPERATION_POLL_SECONDS
        # Steps in threads (each with its own connection), or one after the other.
        self.threaded = self.op.max_parallel > 1 and _threads_can_share_the_database()
        self.secrets = [
            secret
            for profile in Profile.objects.filter(model_id=self.op.model_id)
            for secret in profile_secrets(profile.engine, profile.env or {})
        ]

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
    ) -> Replica:
        """Set a replica's state, release or take its cards, and audit it, in one transaction."""

        @transaction.atomic
        def write() -> Replica:
            replica = Replica.objects.select_for_update().get(pk=replica_id)
            held = [str(s.card) for s in Shard.objects.filter(replica=replica).select_related("card__node")]
            before = self._replica_after(replica, held)
            replica.state = state
            replica.save(update_fields=["state"])
            if release:
                Shard.objects.filter(replica=replica).delete()
                held = []
            if hold is not None:
                node, indices = hold
                cards = list(Card.objects.filter(node=node, index__in=indices).select_related("node"))
                Shard.objects.bulk_create(Shard(replica=replica, card=c) for c in cards)
                held = [str(c) for c in cards]
            audit_record(
                action=action,
                object_type="replica",
                object_key=replica.name,
                object_repr=str(replica),
                before=before,
                after=self._replica_after(replica, held),
                message=self._said(message),
                actor=self.actor,
            )
            return replica

        return write()

    # -- steps: bookkeeping ----------------------------------------------------------------------

    def _step(self, step_id: int) -> Step:
        return Step.objects.select_related("old_replica", "new_replica").get(pk=step_id)

    def _set_step(self, step: Step, **fields: Any) -> None:
        if isinstance(fields.get("reason"), str):
            # An engine's log tail or an agent's sentence may echo a secret of the profile's.
            fields["reason"] = redact(fields["reason"], self.secrets)
        for name, value in fields.items():
            setattr(step, name, value)
        Step.objects.filter(pk=step.pk).update(**fields)

    def _finish_step(self, step: Step, state: str, reason: str) -> str:
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
        resume = [pk for pk, state in steps if state in Step.IN_FLIGHT_STATES]
        queue = deque(resume + [pk for pk, state in steps if state == Step.State.PENDING])
        # A step that failed in an earlier attempt already stopped the operation starting new ones.
        stopping = any(state == Step.State.FAILED for _, state in steps)
        cancelled = False
        running: dict[Future[str], int] = {}
        pool = (
            ThreadPoolExecutor(max_workers=op.max_parallel, thread_name_prefix=f"restart-{op.pk}")
            if self.threaded
            else None
        )
        try:
            while queue or running:
                self.lease.tick()
                while queue and len(running) < op.max_parallel:
                    step_id = queue[0]
                    if step_id not in resume:  # steps in flight are always finished
                        if stopping or cancelled:
                            break
                        if Op.objects.filter(pk=op.pk, cancel_requested=True).exists():
                            cancelled = True
                            break
                    queue.popleft()
                    if pool is None:
                        if self._run_step(step_id) == Step.State.FAILED:
                            stopping = True
                    else:
                        running[pool.submit(self._run_step_in_thread, step_id)] = step_id
                if pool is None and (stopping or cancelled or not queue):
                    break
                if running:
                    done, _ = wait(running, timeout=self.lease.interval, return_when=FIRST_COMPLETED)
                    for future in done:
                        running.pop(future)
                        if future.result() == Step.State.FAILED:
                            stopping = True
                elif stopping or cancelled:
                    break
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        self.lease.tick()
        if not cancelled and Op.objects.filter(pk=op.pk, cancel_requested=True).exists() and queue:
            cancelled = True
        return self._finish(cancelled=cancelled)

    def _run_step_in_thread(self, step_id: int) -> str:
        try:
            return self._run_step(step_id)
        finally:
            connection.close()  # each thread has its own connection

    def _run_step(self, step_id: int) -> str:
        step = self._step(step_id)
        try:
            if step.state == Step.State.PENDING:
                return self._begin(step)
            return self._resume(step)
        except _Lost:
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

    def _begin(self, step: Step) -> str:
        old = step.old_replica
        if old is None or not old.is_live:
            state = old.state if old is not None else "removed"
            return self._finish_step(
                step,
                Step.State.CANCELLED,
                f"{old.name if old else 'The replica'} is {state}: nothing to restart.",
            )
        node, cards = replica_placement(old)
        if node is None:
            return self._finish_step(
                step, Step.State.FAILED, f"{old.name} holds no cards, so there is no node to restart it on."
            )
        old_spec = running_spec(old, node_cards=cards, ready_timeout=self._agent_timeout())
        if not self.op.in_place:
            placed = self._place_beside(step, old_spec)
            if placed:
                return self._roll(step)
            if self.op.in_place is False:
                return self._finish_step(
                    step,
                    Step.State.FAILED,
                    f"No ready node has {self.op.profile.cards} free card(s) of class "
                    f"{self.op.profile.gpu_class} beside the running replicas, and the restart was asked to be "
                    f"rolling only: free cards, or restart in place. {old.name} keeps serving.",
                )
        planned = self._plan_in_place(old, node)
        if isinstance(planned, str):
            return self._finish_step(step, Step.State.FAILED, f"{planned} {old.name} keeps serving.")
        self._set_step(
            step,
            in_place=True,
            state=Step.State.STOPPING,
            started_at=timezone.now(),
            node=node.name,
            cards=planned,
            old_spec=old_spec,
            reason=f"stopping {old.name} to free its cards",
        )
        return self._stop_then_start(step)

    def _plan_in_place(self, old: Replica, node: Node) -> list[int] | str:
        """The cards of ``old``'s node the replacement will use once ``old`` is
        stopped: its own cards first, then free ones; a sentence when too few."""
        profile = Profile.objects.select_related("gpu_class").get(pk=self.op.profile_id)
        need = profile.cards
        usable = Card.objects.filter(node=node, gpu_class_id=profile.gpu_class_id).order_by("index")
        own = list(usable.filter(shard__replica=old).values_list("index", flat=True))
        free = list(usable.filter(shard__isnull=True).values_list("index", flat=True))
        if len(own) + len(free) < need:
            return (
                f"In place needs {need} card(s) of class {profile.gpu_class} on {node.name}, and it has only "
                f"{len(own) + len(free)} with {old.name}'s freed; no node has room beside either."
            )
        return sorted((own + free)[:need])

    def _resume(self, step: Step) -> str:
        """A step a worker left in flight: pick it up where the records say it was."""
        new = step.new_replica
        if step.in_place:
            if new is None:
                return self._stop_then_start(step)
            if new.is_live:
                return self._wait_in_place(step)
            return self._restore(step, step.reason or f"{new.name} failed")
        if new is None:
            return self._begin(step)
        if step.state == Step.State.STOPPING:
            return self._stop_old(step)
        if new.is_live:
            return self._roll(step)
        return self._finish_step(step, Step.State.FAILED, step.reason or f"{new.name} failed")

    # rolling

    def _place_beside(self, step: Step, old_spec: dict[str, Any] | None) -> bool:
        """Record the replacement on free cards beside the old replica; False when no node has room."""

        @transaction.atomic
        def write() -> bool:
            _lock_placement()
            profile = Profile.objects.select_related("model", "gpu_class").get(pk=self.op.profile_id)
            fit = _best_fit(profile, replacing=step.old_replica)
            if fit is None:
                return False
            node, cards = fit
            port = _free_port(node)
            indices = [c.index for c in cards]
            spec = profile_spec(profile, port=port, cards=indices, ready_timeout=self._agent_timeout())
            new = Replica.objects.create(
                name=_replica_name(profile.model, step),
                profile=profile,
                port=port,
                state=Replica.State.STARTING,
                revision=profile.revision,
            )
            Shard.objects.bulk_create(Shard(replica=new, card=c) for c in cards)
            old = step.old_replica
            audit_record(
                action="start",
                object_type="replica",
                object_key=new.name,
                object_repr=str(new),
                after=self._replica_after(new, [str(c) for c in cards]),
                actor=self.actor,
                message=self._said(
                    f"started {new.name} on {node.name} cards {indices} port {port}, "
                    f"revision {profile.revision}, to replace {old.name}"
                ),
            )
            fields = {
                "new_replica": new,
                "node": node.name,
                "cards": indices,
                "state": Step.State.STARTING,
                "started_at": timezone.now(),
                "spec": spec,
                "old_spec": old_spec,
                "in_place": False,
                "reason": f"starting {new.name} on {node.name} beside {old.name}",
            }
            Step.objects.filter(pk=step.pk).update(**fields)
            for name, value in fields.items():
                setattr(step, name, value)
            return True

        return write()

    def _roll(self, step: Step) -> str:
        try:
            self._launch_and_wait(step, step.new_replica, step.spec)
        except _StepFailed as exc:
            old = step.old_replica
            reason = self._stop_replacement(step, exc)
            return self._finish_step(step, Step.State.FAILED, f"{reason} {old.name} keeps serving.")
        return self._stop_old(step)

    def _stop_old(self, step: Step) -> str:
        old, new = step.old_replica, step.new_replica
        if step.state != Step.State.STOPPING:
            self._set_step(
                step, state=Step.State.STOPPING, reason=f"{new.name} is ready; stopping {old.name}"
            )
        old = Replica.objects.get(pk=old.pk)
        if old.is_live:
            node, _ = replica_placement(old)
            if node is not None:
                try:
                    self._agent(node).stop(old.name)
                except AgentError as exc:
                    return self._finish_step(
                        step,
                        Step.State.FAILED,
                        f"{new.name} is ready, but {old.name} could not be stopped: {exc.message} Both are "
                        f"recorded as running: stop {old.name} once its node answers.",
                    )
            self._replica_change(
                old.pk,
                state=Replica.State.STOPPED,
                action="stop",
                release=True,
                message=f"stopped {old.name}: {new.name} replaces it and is ready",
            )
        return self._finish_step(
            step,
            Step.State.SUCCEEDED,
            f"{old.name} replaced by {new.name} on {step.node} cards {step.cards}.",
        )

    # in place

    def _stop_then_start(self, step: Step) -> str:
        old = Replica.objects.get(pk=step.old_replica_id)
        node = Node.objects.get(name=step.node)
        if old.is_live:
            try:
                self._agent(node).stop(old.name)
            except AgentError as exc:
                return self._finish_step(
                    step,
                    Step.State.FAILED,
                    f"{old.name} could not be stopped to free its cards: {exc.message} "
                    f"Nothing was changed: {old.name} is still recorded as running.",
                )

        @transaction.atomic
        def swap() -> Replica | None:
            profile = Profile.objects.select_related("model").get(pk=self.op.profile_id)
            current = Replica.objects.select_for_update().get(pk=old.pk)
            if (
                Shard.objects.filter(card__node=node, card__index__in=step.cards)
                .exclude(replica=current)
                .exists()
            ):
                return None  # another replica took a free card meanwhile
            if current.is_live:
                before = self._replica_after(current, [f"{node.name}#{i}" for i in step.cards])
                current.state = Replica.State.STOPPED
                current.save(update_fields=["state"])
                Shard.objects.filter(replica=current).delete()
                audit_record(
                    action="stop",
                    object_type="replica",
                    object_key=current.name,
                    object_repr=str(current),
                    before=before,
                    after=self._replica_after(current, []),
                    actor=self.actor,
                    message=self._said(f"stopped {current.name} to restart it in place"),
                )
            spec = profile_spec(
                profile, port=current.port, cards=list(step.cards), ready_timeout=self._agent_timeout()
            )
            new = Replica.objects.create(
                name=_replica_name(profile.model, step),
                profile=profile,
                port=current.port,
                state=Replica.State.STARTING,
                revision=profile.revision,
            )
            cards = list(Card.objects.filter(node=node, index__in=step.cards).select_related("node"))
            Shard.objects.bulk_create(Shard(replica=new, card=c) for c in cards)
            audit_record(
                action="start",
                object_type="replica",
                object_key=new.name,
                object_repr=str(new),
                after=self._replica_after(new, [str(c) for c in cards]),
                actor=self.actor,
                message=self._said(
                    f"started {new.name} in place of {current.name} on {node.name} cards "
                    f"{list(step.cards)} port {current.port}, revision {profile.revision}"
                ),
            )
            fields = {
                "new_replica": new,
                "spec": spec,
                "state": Step.State.STARTING,
                "reason": f"starting {new.name} in place of {current.name}",
            }
            Step.objects.filter(pk=step.pk).update(**fields)
            for name, value in fields.items():
                setattr(step, name, value)
            return new

        if swap() is None:
            return self._restore(
                step,
                f"The cards {list(step.cards)} of {node.name} were taken by another "
                "replica before the replacement could start.",
            )
        return self._wait_in_place(step)

    def _wait_in_place(self, step: Step) -> str:
        try:
            self._launch_and_wait(step, step.new_replica, step.spec)
        except _StepFailed as exc:
            return self._restore(step, self._stop_replacement(step, exc))
        return self._finish_step(
            step,
            Step.State.SUCCEEDED,
            f"{step.old_replica.name} replaced in place by {step.new_replica.name} on "
            f"{step.node} cards {step.cards}.",
        )

    def _restore(self, step: Step, reason: str) -> str:
        """Start the old replica again, with the spec it ran, on its cards."""
        old = Replica.objects.get(pk=step.old_replica_id)
        if not step.old_spec:
            return self._finish_step(
                step,
                Step.State.FAILED,
                f"{reason} The spec {old.name} ran before is not known, so it was not "
                "started again: start it by hand.",
            )
        node = Node.objects.get(name=step.node)
        self._set_step(step, state=Step.State.STARTING, reason=f"{reason} Starting {old.name} again.")
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
                    Step.State.FAILED,
                    f"{reason} {old.name} was not started again: its cards were taken meanwhile.",
                )
        try:
            self._launch_and_wait(step, old, step.old_spec)
        except _StepFailed as exc:
            if exc.started:
                self._try_stop(node, old.name)
            self._replica_change(
                old.pk,
                state=Replica.State.FAILED,
                action="fail",
                release=True,
                message=f"{old.name} did not come back: {exc.reason}",
            )
            return self._finish_step(
                step,
                Step.State.FAILED,
                f"{reason} {old.name} could not be started again either: {exc.reason}",
            )
        return self._finish_step(
            step,
            Step.State.FAILED,
            f"{reason} {old.name} was started again with its previous spec and is ready.",
        )

    # shared

    def _agent_timeout(self) -> float:
        return self.op.ready_timeout + AGENT_DEADLINE_MARGIN

    def _agent(self, node: Node) -> AgentClient:
        return AgentClient.for_node(node)

    def _try_stop(self, node: Node, name: str) -> str:
        """Stop a replica on its agent; '' when done, else the reason it could not be."""
        try:
            self._agent(node).stop(name)
        except AgentError as exc:
            return exc.message
        return ""

    def _stop_replacement(self, step: Step, failure: _StepFailed) -> str:
        """Stop a replacement that did not come up; record it failed, cards released. Returns the reason."""
        new = Replica.objects.get(pk=step.new_replica_id)
        reason = failure.reason
        self._set_step(step, reason=reason)  # kept, should this worker die while it cleans up
        if failure.started:
            left = self._try_stop(Node.objects.get(name=step.node), new.name)
            if left:
                reason += f" It could not be stopped either: {left} It may still run on {step.node}."
        if new.is_live:
            self._replica_change(
                new.pk,
                state=Replica.State.FAILED,
                action="fail",
                release=True,
                message=f"{new.name} failed: {failure.reason}",
            )
        self._set_step(step, reason=reason)
        return reason

    def _launch_and_wait(self, step: Step, replica: Replica, spec: dict[str, Any]) -> None:
        """PUT the spec (again: harmless) and poll until ready; _StepFailed otherwise."""
        node = Node.objects.get(name=step.node)
        agent = self._agent(node)
        self._check_node_policy(node, agent, replica)
        movable = not step.in_place and replica.pk == step.new_replica_id
        for attempt in range(PORT_TRIES):
            try:
                state = agent.start(replica.name, spec)
                break
            except AgentError as exc:
                if exc.agent_code == "port_busy" and movable and attempt + 1 < PORT_TRIES:
                    # Another program on the node holds the port: a replacement nobody
                    # uses yet may as well take the next one.
                    replica, spec = self._move_port(step, replica, spec, node, exc.message)
                    continue
                certain = exc.code in ("agent_token", "agent_refused") or (
                    exc.code == "agent_down" and "refused the connection" in exc.message
                )
                raise _StepFailed(
                    f"{replica.name} could not be started: {exc.message}", started=not certain
                ) from None
        if step.state == Step.State.STARTING:
            self._set_step(step, state=Step.State.WAITING, reason=f"waiting for {replica.name} to be ready")
        deadline = time.monotonic() + self.op.ready_timeout
        errors = 0
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
                )
                recorded = now_state
            if now_state == "ready":
                return
            if now_state == "failed":
                raise _StepFailed(f"{replica.name} failed on {node.name}: {describe_failure(state)}")
            if now_state == "stopped":
                raise _StepFailed(
                    f"{replica.name} was stopped on {node.name} before it was ready "
                    f"({state.get('reason') or 'no reason given'})."
                )
            reason = str(state.get("reason") or "")
            if reason and reason != said and now_state in ("starting", "loading"):
                said = reason
                self._set_step(step, reason=f"waiting for {replica.name}: {now_state}: {reason}")
            if time.monotonic() >= deadline:
                raise _StepFailed(
                    f"{replica.name} was not ready within {self.op.ready_timeout:g} s "
                    f"({now_state}{': ' + reason if reason else ''})."
                )
            time.sleep(min(self.poll, max(deadline - time.monotonic(), 0.01)))
            try:
                state = agent.get(replica.name)
                errors = 0
            except AgentError as exc:
                errors += 1
                if errors >= POLL_ERRORS_ALLOWED or exc.code in ("agent_token", "not_found"):
                    raise _StepFailed(f"{replica.name} could not be watched: {exc.message}") from None

    def _check_node_policy(self, node: Node, agent: AgentClient, replica: Replica) -> None:
        """The node's agent enforces the same launch policy as the control plane:
        otherwise what one allowed the other might refuse (or the reverse), and
        nothing is sent."""
        try:
            theirs = agent.node_info().get("policy")
        except AgentError:
            # Not known to differ: the start that follows says what is wrong with
            # the agent, and the agent applies its own policy in any case.
            return
        ours = default_policy().digest
        if theirs != ours:
            said = f"launch policy {theirs}" if theirs else "no launch policy (an agent older than it)"
            raise _StepFailed(
                f"{replica.name} was not started: the agent of node {node.name} enforces {said}, but the "
                f"control plane's is {ours}. Deploy the same agent/llmgw_policy/policy.toml to both.",
                started=False,
            )

    def _move_port(
        self, step: Step, replica: Replica, spec: dict[str, Any], node: Node, why: str
    ) -> tuple[Replica, dict[str, Any]]:
        """The replacement on the next free port: its row, its step's spec and the audit log say so."""

        @transaction.atomic
        def write() -> tuple[Replica, dict[str, Any]]:
            _lock_placement()
            row = Replica.objects.select_for_update().get(pk=replica.pk)
            old_port, port = row.port, _free_port(node, after=row.port)
            args = list(spec["args"])
            for i in range(len(args) - 1):
                if args[i] == "--port" and args[i + 1] == str(old_port):
                    args[i + 1] = str(port)
            moved = {**spec, "port": port, "args": args}
            before = {"port": old_port}
            row.port = port
            row.save(update_fields=["port"])
            self._set_step(step, spec=moved, reason=f"port {old_port} is taken on {node.name}; trying {port}")
            audit_record(
                action="move_port",
                object_type="replica",
                object_key=row.name,
                object_repr=str(row),
                before=before,
                after={"port": port},
                actor=self.actor,
                message=self._said(f"{row.name} moved from port {old_port} to {port} on {node.name}: {why}"),
            )
            return row, moved

        return write()

    def _fail(self, step: Step, reason: str) -> str:
        """Fail a step in flight the way its mode says: stop the replacement, keep or restore the old one."""
        step = self._step(step.pk)
        new = step.new_replica
        if (
            not step.in_place
            and step.state == Step.State.STOPPING
            and new is not None
            and new.state == "ready"
        ):
            return self._stop_old(step)  # the replacement is ready: finishing the step beats rolling it back
        if new is not None and new.is_live:
            reason = self._stop_replacement(step, _StepFailed(reason))
        if step.in_place and step.old_replica_id and step.node:
            # Whether or not its agent already stopped it: PUTting its spec again is harmless.
            return self._restore(step, reason)
        return self._finish_step(step, Step.State.FAILED, reason)

    # -- the end -------------------------------------------------------------------------------

    def _give_up(self) -> str:
        op = self.op
        reason = (
            f"Workers took this restart up {op.attempts - 1} time(s) without finishing it (the last was "
            f"{op.worker}); it is stopped here, with its steps in flight rolled back."
        )
        for step_id in op.steps.filter(state__in=Step.IN_FLIGHT_STATES).values_list("pk", flat=True):
            self._fail(self._step(step_id), reason)
        return self._finish(cancelled=False, reason=reason)

    def _finish(self, *, cancelled: bool, reason: str = "") -> str:
        op = self.op
        now = timezone.now()

        @transaction.atomic
        def write() -> str:
            current = Op.objects.select_for_update().get(pk=op.pk)
            if current.state != Op.State.RUNNING or current.worker != self.lease.worker:
                raise _Lost()
            failed_before = Step.objects.filter(operation=op, state=Step.State.FAILED).exists()
            why = (
                "cancelled by request"
                if cancelled
                else "not started: an earlier step failed"
                if failed_before
                else "not started"
            )
            Step.objects.filter(operation=op, state=Step.State.PENDING).update(
                state=Step.State.CANCELLED, finished_at=now, reason=why
            )
            steps = list(Step.objects.filter(operation=op).select_related("old_replica").order_by("id"))
            ok = [s for s in steps if s.state == Step.State.SUCCEEDED]
            bad = [s for s in steps if s.state == Step.State.FAILED]
            if bad:
                state = Op.State.PARTLY_FAILED if ok else Op.State.FAILED
            elif cancelled:
                state = Op.State.CANCELLED
            else:
                state = Op.State.SUCCEEDED
            summary = f"{len(ok)} of {len(steps)} replica(s) restarted"
            if bad:
                first = bad[0]
                name = first.old_replica.name if first.old_replica_id else f"step {first.pk}"
                summary += f"; {name}: {first.reason.splitlines()[0] if first.reason else 'failed'}"
                if len(bad) > 1:
                    summary += f" (and {len(bad) - 1} more failed)"
            if cancelled:
                summary += "; the rest cancelled on request"
            summary = summary.rstrip(".") + "."
            text = f"{reason} {summary}" if reason else summary
            before = {"state": current.state}
            current.state, current.finished_at, current.reason, current.heartbeat_at = state, now, text, now
            current.save(update_fields=["state", "finished_at", "reason", "heartbeat_at"])
            audit_record(
                action="restart_finish",
                object_type="restartoperation",
                object_key=str(op.pk),
                object_repr=str(current),
                before=before,
                after={"state": state, "reason": text},
                actor=self.actor,
                message=self._said(f"restart #{op.pk} {state.replace('_', ' ')}: {text}"),
            )
            return state

        try:
            state = write()
        except _Lost:
            return "lost"
        log.info("restart #%s: %s", op.pk, state)
        return state
