"""Stopping an engine: first its requests in flight drained (read from its own /metrics gauges,
``probe.in_flight``), then SIGTERM to its process group, SIGKILL after the grace. The supervisor
calls these with its lock released and records what they answer."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

from .process import group_alive, signal_group
from .record import Replica

log = logging.getLogger("llmgw_agent")

KILL_WAIT = 5.0
DRAIN_POLL = 0.2  # seconds between two reads of an engine's requests in flight while a stop drains it


def drain(record: Replica, seconds: float, in_flight: Callable[[int], int | None]) -> str:
    """Wait up to ``seconds`` for the engine's requests in flight to finish; what came of it, for
    the stop's reason ("" when none was in flight). An engine that does not report them is not
    waited for: SIGTERM then, and an engine that drains on SIGTERM (vLLM >= 0.18 with
    --shutdown-timeout, the stand-in) finishes them within the stop's grace."""
    started = time.monotonic()
    deadline = started + seconds
    first: int | None = None
    while True:
        try:
            count = in_flight(record.spec.port)
        except Exception:  # a read must never stop a stop
            log.exception("replica %s: reading its requests in flight failed", record.id)
            count = None
        first = count if first is None else first
        if record.handle is not None and record.handle.exited():
            return "it exited while draining"
        if count is None:
            return "the engine does not report its requests in flight (no /metrics), so none were waited for"
        if count == 0:
            waited = time.monotonic() - started
            return f"drained: {first} request(s) in flight finished in {waited:.1f}s" if first else ""
        if time.monotonic() >= deadline or record.done.is_set():
            return f"{count} request(s) still in flight after the drain deadline of {seconds:g}s"
        time.sleep(DRAIN_POLL)


def terminate(record: Replica, grace: float, before_kill: Callable[[], None]) -> None:
    """SIGTERM to the engine's process group, SIGKILL once ``grace`` seconds are over;
    ``before_kill`` is called first then (so that whoever sees the exit knows it was killed)."""
    handle = record.handle
    assert handle is not None
    pgid = handle.pid
    log.info("replica %s: stopping pid %s (grace %gs)", record.id, pgid, grace)
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    handle.wait(deadline - time.monotonic())
    # Give the engine's workers the rest of the grace period too.
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if handle.exited() and not group_alive(pgid):
        return
    before_kill()
    signal_group(pgid, signal.SIGKILL)
    if not handle.wait(KILL_WAIT):
        log.error("replica %s: pid %s survived SIGKILL for %gs", record.id, pgid, KILL_WAIT)
