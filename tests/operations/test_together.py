"""The queue a run's step threads hand their placements to (``runner/together.py``): what is handed
in while a batch is under way is done together in the next, and what a batch raises, each of its
threads raises. No database: the batches here are lists of numbers."""

from __future__ import annotations

import threading

import pytest
from agent_testing import wait_until

from operations.services.runner.together import Together


def test_items_handed_in_while_a_batch_is_under_way_are_done_together_in_the_next():
    together: Together[int, int] = Together()
    batches: list[list[int]] = []
    first_under_way, go_on = threading.Event(), threading.Event()
    results: dict[int, int] = {}

    def double(batch: list[int]) -> list[int]:
        batches.append(batch)
        if batch == [0]:
            first_under_way.set()
            go_on.wait(timeout=10)
        return [n * 2 for n in batch]

    def hand_in(n: int) -> None:
        results[n] = together.do(n, double)

    threads = [threading.Thread(target=hand_in, args=(n,)) for n in range(4)]
    threads[0].start()
    assert first_under_way.wait(timeout=10)
    for t in threads[1:]:
        t.start()
    wait_until(lambda: together.queued() == 3, timeout=10, what="three items queued")
    go_on.set()
    for t in threads:
        t.join(timeout=10)
    assert batches == [[0], [1, 2, 3]]
    assert results == {0: 0, 1: 2, 2: 4, 3: 6}


def test_what_a_batch_raises_each_of_its_threads_raises_and_the_next_batch_still_runs():
    together: Together[int, int] = Together()

    def refuse(batch: list[int]) -> list[int]:
        raise ValueError(f"refused {batch}")

    with pytest.raises(ValueError, match=r"refused \[7\]"):
        together.do(7, refuse)
    assert together.do(8, lambda batch: [n + 1 for n in batch]) == 9
