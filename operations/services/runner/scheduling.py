"""Scheduling a run's steps: ``max_parallel`` at a time, each in a thread of its own.

A step holds one of the ``max_parallel`` slots until its replacement is ready (in place: until it
ends); then it stops its old replica beside the next steps, ending when the stop is confirmed, so
the next one starts the moment a replacement is ready rather than once an old engine has exited.
A step whose planned cards a step under way still holds (its old replica, stopping) waits for
that step to end while a later one whose cards are free goes first (``_next_with_its_cards``).
Steps in flight when the run began (a worker left them) are always finished; no new step starts
once the operation is cancelled, or once a step failed when it stops at the first failure. Where
the database cannot be shared by threads (SQLite), the steps run one after the other.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from queue import Empty, SimpleQueue
from threading import Lock
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from catalog.models import Shard
from operations.models import RestartOperation, RestartStep
from operations.services.lease import Lease
from operations.services.timing import RunClock

# What a step thread tells the run loop: (step, ended?, its end state or the exception it raised).
Event = tuple[int, bool, str | Exception | None]
RunStep = Callable[[int], str]


class Scheduler:
    """Which step runs when, for one run of an operation."""

    def __init__(self, op: RestartOperation, lease: Lease, clock: RunClock, *, threaded: bool):
        self.op = op
        self.lease = lease
        self.clock = clock
        # Steps in threads (each with its own connection), or one after the other. One at a time
        # too, a step's old replica stops in its thread while the next step's replacement starts.
        self.threaded = threaded
        self._events: SimpleQueue[Event] = SimpleQueue()
        self.queue: deque[int] = deque()
        self.resume: list[int] = []  # steps in flight when the run began
        self.stopping = False  # a step failed and the operation stops at the first failure
        self.cancelled = False
        # ``loading``: the steps holding a slot; ``under_way``: every step not ended.
        self.loading: set[int] = set()
        self.under_way: set[int] = set()
        # Each step's planned places and the replica it restarts, as the restart's plan wrote
        # them (never changed after): read with the steps, not again at every slot freed.
        self._places: dict[int, tuple[list[tuple[str, list[int]]], int | None]] = {}
        # The step threads' connections, each kept for the thread's next step and closed at the
        # run's end: a new one a step cost a backend started anew and its caches filled cold
        # (the tables', the triggers' compiled functions), on the path between a freed slot and
        # the next engine's start.
        self._connections: list[BaseDatabaseWrapper] = []
        self._connections_lock = Lock()

    def schedule(self, run_step: RunStep) -> bool:
        """Run the operation's steps with ``run_step`` until none is left to start and every step
        started has ended; True when the operation was cancelled."""
        op = self.op
        self.read_steps()
        if self.threaded:
            try:
                with ThreadPoolExecutor(
                    max_workers=2 * op.max_parallel, thread_name_prefix=f"restart-{op.pk}"
                ) as pool:
                    self._side_by_side(pool, run_step)
            finally:
                self._close_connections()
        else:
            self._one_at_a_time(run_step)
        self.lease.tick()
        self.clock.summary()
        if not self.cancelled and self._cancel_requested() and self.queue:
            self.cancelled = True
        return self.cancelled

    def read_steps(self) -> None:
        """The operation's steps, once: those to resume, those to start in turn, and each one's
        planned places (``_with_their_cards``)."""
        rows = list(
            self.op.steps.order_by("id").values_list(
                "pk", "state", "planned_node", "planned_cards", "planned_ranks", "old_replica_id"
            )
        )
        self._places = {pk: (_places(node, cards, ranks), old) for pk, _, node, cards, ranks, old in rows}
        self.resume = [pk for pk, state, *_ in rows if state in RestartStep.IN_FLIGHT_STATES]
        self.queue = deque(self.resume + [pk for pk, state, *_ in rows if state == RestartStep.State.PENDING])
        # A step that failed in an earlier attempt already stopped the operation starting new ones.
        self.stopping = self.op.stop_at_first_failure and any(
            state == RestartStep.State.FAILED for _, state, *_ in rows
        )

    def slot_free(self, step: RestartStep) -> None:
        """The step's replacement is ready: the run may start the next step while this one stops
        its old replica (whose cards the run still counts as held until this step ends)."""
        if self.threaded:
            self._events.put((step.pk, False, None))

    # -- the loops ---------------------------------------------------------------------------------

    def _one_at_a_time(self, run_step: RunStep) -> None:
        self.lease.tick()
        while self.queue:
            step_id = self._next()
            if step_id is None:
                return
            self._take(step_id)
            self.clock.slots(1)
            if run_step(step_id) == RestartStep.State.FAILED:
                self.stopping = self.stopping or self.op.stop_at_first_failure

    def _side_by_side(self, pool: ThreadPoolExecutor, run_step: RunStep) -> None:
        while self.queue or self.under_way:
            self.lease.tick()
            self._fill_slots(pool, run_step)
            if self.under_way:
                self._take_events()
            elif self.stopping or self.cancelled:
                break

    def _fill_slots(self, pool: ThreadPoolExecutor, run_step: RunStep) -> None:
        """Start steps while a slot is free (and at most twice ``max_parallel`` are under way).
        Which steps may start is asked once for all the free slots (``_startable``), not once a
        slot: starting a step changes no other's answer, and a wave of 16 asked one by one put
        three queries between each step's start and the next's."""
        parallel = self.op.max_parallel
        free = min(parallel - len(self.loading), 2 * parallel - len(self.under_way))
        if not self.queue or free <= 0:
            return
        for step_id in self._startable(free):
            self._take(step_id)
            self.loading.add(step_id)
            self.under_way.add(step_id)
            pool.submit(self._run_in_thread, run_step, step_id)

    def _take_events(self) -> None:
        """Wait a heartbeat's interval at most for the step threads: a slot freed, a step ended
        (raising what its thread raised)."""
        self.clock.slots(len(self.loading), empty_because="cards" if self.queue else "done")
        for step_id, ended, outcome in self._next_events():
            self.loading.discard(step_id)
            if not ended:
                continue  # its replacement is ready: its slot is free
            self.under_way.discard(step_id)
            if isinstance(outcome, Exception):
                raise outcome
            if outcome == RestartStep.State.FAILED:
                self.stopping = self.stopping or self.op.stop_at_first_failure
        self.clock.slots(len(self.loading))

    def _run_in_thread(self, run_step: RunStep, step_id: int) -> None:
        self._keep_connection()
        try:
            outcome: str | Exception = run_step(step_id)
        except Exception as exc:  # OperationLost, or worse: the run loop raises it
            outcome = exc
        finally:
            # Each thread has its own connection, kept for its next step unless it is broken.
            connection.close_if_unusable_or_obsolete()
        self._events.put((step_id, True, outcome))

    def _keep_connection(self) -> None:
        """Note this thread's connection (once), to be closed by the run loop at the run's end."""
        own = connections[DEFAULT_DB_ALIAS]
        with self._connections_lock:
            if any(kept is own for kept in self._connections):
                return
            own.inc_thread_sharing()  # closed from the run loop's thread, once the pool is done
            self._connections.append(own)

    def _close_connections(self) -> None:
        with self._connections_lock:
            kept, self._connections = self._connections, []
        for own in kept:
            own.close()
            own.dec_thread_sharing()

    def _next_events(self) -> list[Event]:
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

    # -- which step next ---------------------------------------------------------------------------

    def _next(self) -> int | None:
        """The step to start now, or None: none is to start (stopping, cancelled), or the steps
        under way are yet to free the cards of every step queued."""
        step_id = self.queue[0]
        if step_id in self.resume:  # steps in flight are always finished
            return step_id
        if self.stopping or self.cancelled:
            return None
        if self._cancel_requested():
            self.cancelled = True
            return None
        if self.under_way:
            # None: the steps under way free the cards: wait for the next to end
            return self._next_with_its_cards(list(self.under_way))
        return step_id

    def _startable(self, free: int) -> list[int]:
        """Up to ``free`` steps to start now, the ones ``_next`` would give one by one: the steps
        in flight when the run began, then (unless stopping or cancelled) the first queued step
        when nothing is under way, and the queued steps whose cards no other step is yet to free."""
        queue = list(self.queue)
        chosen: list[int] = []
        while queue and len(chosen) < free and queue[0] in self.resume:
            chosen.append(queue.pop(0))  # steps in flight are always finished
        if len(chosen) == free or not queue or self.stopping or self.cancelled:
            return chosen
        if self._cancel_requested():
            self.cancelled = True
            return chosen
        if not self.under_way and not chosen:
            chosen.append(queue.pop(0))
            if len(chosen) == free or not queue:
                return chosen
        return chosen + self._with_their_cards([*self.under_way, *chosen], queue)[: free - len(chosen)]

    def _take(self, step_id: int) -> None:
        self.queue.remove(step_id)
        self.clock.submitted(step_id)

    def _cancel_requested(self) -> bool:
        return RestartOperation.objects.filter(pk=self.op.pk, cancel_requested=True).exists()

    def _next_with_its_cards(self, running: list[int]) -> int | None:
        """The first queued step whose planned cards no other step of the run is yet to free, or None."""
        startable = self._with_their_cards(running, [pk for pk in self.queue if pk not in self.resume])
        return startable[0] if startable else None

    def _with_their_cards(self, running: list[int], pending: list[int]) -> list[int]:
        """The ``pending`` steps, in order, whose planned cards no other step of the run is yet to free.
        Starting one changes no other's answer: the steps counted (``running`` and ``pending``)
        are the same before and after.

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
        places = self._places  # every step of the run (``read_steps``)
        olds = (places[pk][1] for pk in [*running, *pending])
        freeing = {old for old in olds if old is not None}
        nodes = {node for pk in pending for node, _ in places[pk][0]}
        held = {
            (node, index): replica
            for node, index, replica in Shard.objects.filter(
                card__node__name__in=nodes, replica_id__in=freeing
            ).values_list("card__node__name", "card__index", "replica_id")
        }
        startable = []
        for pk in pending:
            planned, own = places[pk]
            holders = {held.get((node, i)) for node, cards in planned for i in cards}
            if not holders - {None, own}:  # in place, its own cards are its to free
                startable.append(pk)
        return startable


def _places(node: str, cards: list[int], ranks: list[dict[str, Any]]) -> list[tuple[str, list[int]]]:
    """Every rank's planned place of a replacement across nodes; the one place of one on one node;
    none when the plan gave it none."""
    return [(p["node"], list(p["cards"])) for p in ranks] or ([(node, list(cards))] if node else [])
