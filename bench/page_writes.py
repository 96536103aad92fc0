"""What bench/pages.py writes between its requests, as the fleet does: a replica's state flipped (a
restart's writes), a model edited (an editor's), and the telemetry sampler's writes without its
agent calls (``SamplerWrites``). Run only from bench/pages.py, with Django set up."""

from __future__ import annotations

import random
import threading
import time
from typing import Any


def _flip_replica() -> None:
    """One replica's state, ready ↔ loading, as the runner writes it during a restart: raises the
    replicas' version (versions/triggers.py) and nothing else."""
    from catalog.models import Replica

    replica = Replica.objects.filter(name__startswith="gen-model-003-").order_by("name").first()
    if replica is None:
        raise SystemExit("the generated fleet has no replica of gen-model-003")
    state = "loading" if replica.state == "ready" else "ready"
    Replica.objects.filter(pk=replica.pk).update(state=state)


def _edit_model() -> None:
    """One model's source edited: raises the models' version (versions/triggers.py) and nothing else."""
    from catalog.models import ServedModel

    model = ServedModel.objects.get(name="gen-model-003")
    source = model.source[:-1] if model.source.endswith("~") else f"{model.source}~"
    ServedModel.objects.filter(pk=model.pk).update(source=source)


WRITES = {"replica": _flip_replica, "structure": _edit_model}


class SamplerWrites:
    """The telemetry sampler's writes without its agent calls: every node's readings recorded once
    per ``LLMGW_TELEMETRY_SECONDS`` (the default, 15 s), batched as ``fleet_sample`` writes them, or
    (``batched=False``) one node a transaction through ``telemetry_record``, eight at a time, the
    round's nodes spread over the interval; a round that takes longer than the interval is followed
    by the next at once, as the sampler's is."""

    def __init__(self, nodes: int, parallel: int = 8, *, batched: bool = True) -> None:
        self.parallel = parallel
        # Batched (the default) writes as the worker's sampler does (``fleet_sample``): once an
        # interval, every node's readings through ``readings_write``, LLMGW_TELEMETRY_BATCH nodes a
        # transaction, then the prune, then rest. Per node (``batched=False``): one transaction a node
        # spread over the interval, as the sampler wrote before its batching: about 200 times as many
        # raises of the readings' version, the harsher load.
        self.batched = batched
        self.recorded = 0
        self.rounds = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._next = 0
        from django.conf import settings

        from catalog.models import Node

        self.interval = settings.LLMGW_TELEMETRY_SECONDS
        self.nodes = list(Node.objects.filter(name__startswith="gen-").order_by("name"))
        self._round_start = time.monotonic()

    def body(self, node: Any, rng: random.Random) -> dict[str, Any]:
        return {
            "source": "nvidia-smi",
            "cards": [
                {
                    "index": i,
                    "memory_used_mib": rng.randrange(1000, 80000),
                    "memory_total_mib": 81559,
                    "utilization_percent": rng.randrange(0, 100),
                    "temperature_c": rng.randrange(30, 80),
                    "processes": [],
                }
                for i in range(8)
            ],
        }

    def _claim(self) -> tuple[Any, float] | None:
        """The next node to record and when it is due, a new round begun after the last."""
        with self._lock:
            if self._next >= len(self.nodes):
                self._next = 0
                self.rounds += 1
                self._round_start = max(self._round_start + self.interval, time.monotonic())
            i = self._next
            self._next += 1
            return self.nodes[i], self._round_start + self.interval * i / max(1, len(self.nodes))

    def _work(self) -> None:
        from django.db import connection

        from telemetry.services import telemetry_record

        rng = random.Random(threading.get_ident())
        try:
            while not self._stop.is_set():
                claimed = self._claim()
                if claimed is None:
                    return
                node, due = claimed
                wait = due - time.monotonic()
                if wait > 0 and self._stop.wait(wait):
                    return
                telemetry_record(node=node, body=self.body(node, rng))
                with self._lock:
                    self.recorded += 1
        finally:
            connection.close()

    def _rounds(self) -> None:
        """The worker sampler's writes: a round of every node in batches, then rest to the interval."""
        from django.conf import settings
        from django.db import connection
        from django.utils import timezone

        from telemetry.services import readings_prune, readings_write

        rng = random.Random(threading.get_ident())
        size = settings.LLMGW_TELEMETRY_BATCH
        try:
            while not self._stop.is_set():
                began, at = time.monotonic(), timezone.now()
                for i in range(0, len(self.nodes), size):
                    chunk = self.nodes[i : i + size]
                    readings_write([(node, self.body(node, rng)) for node in chunk], at=at)
                    with self._lock:
                        self.recorded += len(chunk)
                readings_prune()
                with self._lock:
                    self.rounds += 1
                self._stop.wait(max(0.0, began + self.interval - time.monotonic()))
        finally:
            connection.close()

    def start(self) -> None:
        self._round_start = time.monotonic()
        work, count = (self._rounds, 1) if self.batched else (self._work, self.parallel)
        self._threads = [threading.Thread(target=work, daemon=True) for _ in range(count)]
        for t in self._threads:
            t.start()
        time.sleep(min(2.0, self.interval))  # under way before the first request

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
