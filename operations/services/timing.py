"""Where a restart's time goes, logged at DEBUG (logger ``operations.restart.timing``).

Per step, the phases from the step's start: its replacement placed and recorded, the agent's
answer to the start, the replacement ready, the old replica stopped, the step recorded done;
and, before its start, how long the step waited once a slot was free. Per run: how many steps
ran at once over time (and why a slot stood empty: no step's planned cards were free yet, or no
step was left), and how long the writes waited for and held the operation's row (the lease's
fence), the placement lock and the audit chain's lock. The agent calls are timed too, so that
what the agent and its engine took is told apart from what the worker and the database took.

Nothing here changes what a run does; it only reads the clock (``time.monotonic``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

log = logging.getLogger("operations.restart.timing")

# The marks of a step, in the order a rolling step passes them.
STEP_MARKS = ("began", "placed", "asked", "ready", "stopped", "done")


@dataclass
class _Tally:
    count: int = 0
    total: float = 0.0
    longest: float = 0.0
    unit: str = "s"

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.longest = max(self.longest, seconds)

    def __str__(self) -> str:
        mean = self.total / self.count if self.count else 0.0
        u = self.unit
        return f"n={self.count} total={self.total:.3f}{u} mean={mean:.4f}{u} max={self.longest:.3f}{u}"


@dataclass
class _Step:
    submitted: float
    marks: dict[str, float] = field(default_factory=dict)


class RunClock:
    """The clock of one run; safe to use from the run's step threads."""

    def __init__(self, operation_id: int, max_parallel: int):
        self.operation_id = operation_id
        self.max_parallel = max_parallel
        self.enabled = log.isEnabledFor(logging.DEBUG)
        self._lock = threading.Lock()
        self._began = time.monotonic()
        self._steps: dict[int, _Step] = {}
        self._tallies: dict[str, _Tally] = {}
        # Slot-seconds: steps under way integrated over time, and empty slots by why they were empty.
        self._since = self._began
        self._running = 0
        self._empty_because = ""
        self._busy = 0.0
        self._empty: dict[str, float] = {}

    # -- the run loop --

    def slots(self, running: int, *, empty_because: str = "") -> None:
        """``running`` steps hold a slot from now; the others are empty because ``empty_because``
        ("cards": the next steps' planned cards are still held by steps under way; "done": no step
        is left to start; "": about to be filled)."""
        if not self.enabled:
            return
        now = time.monotonic()
        with self._lock:
            span = now - self._since
            self._busy += self._running * span
            free = max(self.max_parallel - self._running, 0)
            why = self._empty_because or "filling"
            self._empty[why] = self._empty.get(why, 0.0) + free * span
            self._since, self._running, self._empty_because = now, running, empty_because

    def submitted(self, step_id: int) -> None:
        if self.enabled:
            with self._lock:
                self._steps[step_id] = _Step(submitted=time.monotonic())

    # -- the steps --

    def mark(self, step_id: int, name: str) -> None:
        """The step reached ``name`` (the first time only: a step asked again keeps its first)."""
        if not self.enabled:
            return
        now = time.monotonic()
        with self._lock:
            step = self._steps.setdefault(step_id, _Step(submitted=now))
            step.marks.setdefault(name, now)
        if name == "done":
            self._log_step(step_id)

    def _log_step(self, step_id: int) -> None:
        step = self._steps[step_id]
        began = step.marks.get("began", step.submitted)
        parts = [
            f"began {began - self._began:.3f}s into the run",
            f"thread after {began - step.submitted:.3f}s",
        ]
        last = began
        for name in STEP_MARKS[1:]:
            if name in step.marks:
                parts.append(f"{name} +{step.marks[name] - last:.3f}s")
                last = step.marks[name]
        log.debug(
            "restart #%s step %s: %s; %.3f s in all",
            self.operation_id,
            step_id,
            ", ".join(parts),
            last - began,
        )

    # -- locks, writes and agent calls --

    def add(self, what: str, seconds: float, *, unit: str = "s") -> None:
        """Count ``seconds`` under ``what`` (or another figure, in ``unit``: "" for a count)."""
        if self.enabled:
            with self._lock:
                self._tallies.setdefault(what, _Tally(unit=unit)).add(seconds)

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        """Time the block under ``what`` (a lock's wait, a write's transaction, an agent call)."""
        if not self.enabled:
            yield
            return
        began = time.monotonic()
        try:
            yield
        finally:
            self.add(what, time.monotonic() - began)

    # -- the end --

    def summary(self) -> None:
        """Log the run's totals: slot use, and every tally."""
        if not self.enabled:
            return
        self.slots(0)
        with self._lock:
            took = time.monotonic() - self._began
            steps = [s for s in self._steps.values() if "done" in s.marks and "began" in s.marks]
            phases: dict[str, _Tally] = {}
            for step in steps:
                last = step.marks["began"]
                for name in STEP_MARKS[1:]:
                    if name in step.marks:
                        phases.setdefault(name, _Tally()).add(step.marks[name] - last)
                        last = step.marks[name]
            empty = ", ".join(f"{why} {seconds:.1f}" for why, seconds in sorted(self._empty.items()))
            log.debug(
                "restart #%s: %.1f s, %d step(s), %.2f of %d slot(s) busy on average; slot-seconds empty: %s",
                self.operation_id,
                took,
                len(steps),
                self._busy / took if took else 0.0,
                self.max_parallel,
                empty or "none",
            )
            for name, tally in phases.items():
                log.debug("restart #%s: step phase %s: %s", self.operation_id, name, tally)
            for what in sorted(self._tallies):
                log.debug("restart #%s: %s: %s", self.operation_id, what, self._tallies[what])
