"""Work handed in by a run's step threads and done in batches (``placing.py``'s placements, the
replicas' writes of ``records.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class BatchFailed(Exception):
    """A batch of more than one item failed: each is done again alone, so that one that cannot be
    done fails its own step only."""


class Together(Generic[T, R]):
    """Work handed in by a run's threads and done in batches: the thread that finds no batch under
    way does every item queued, its own included, in one call of ``do``; the threads that hand
    theirs in meanwhile wait, and the first of them to wake does the next batch."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._queued: list[_Item[T, R]] = []
        self._busy = False

    def do(self, value: T, do_all: Callable[[list[T]], list[R]]) -> R:
        """``value``'s outcome, from ``do_all`` (given the batch, its outcomes in the same order);
        raises what ``do_all`` raised for the batch ``value`` was in."""
        item: _Item[T, R] = _Item(value)
        with self._changed:
            self._queued.append(item)
            while self._busy and not item.done:
                self._changed.wait()
            lead = not item.done  # no batch under way, and this item in none yet: this thread does one
            if lead:
                self._busy = True
                batch, self._queued = self._queued, []
        if lead:
            try:
                outcomes = do_all([i.value for i in batch])
                for one, outcome in zip(batch, outcomes, strict=True):
                    one.outcome = outcome
            except BaseException as exc:  # each thread of the batch raises it, none reads "not done"
                for one in batch:
                    one.error = exc
            finally:
                with self._changed:
                    for one in batch:
                        one.done = True
                    self._busy = False
                    self._changed.notify_all()
        if item.error is not None:
            raise item.error
        return item.outcome  # type: ignore[return-value]

    def queued(self) -> int:
        """How many items wait for the next batch (tests wait on it)."""
        with self._changed:
            return len(self._queued)


class _Item(Generic[T, R]):
    def __init__(self, value: T):
        self.value = value
        self.done = False
        self.outcome: R | None = None
        self.error: BaseException | None = None
