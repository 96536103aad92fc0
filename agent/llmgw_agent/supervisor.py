"""Replica supervision: start engines as real processes, watch them become
ready, notice when they die, and stop them with their whole process tree.

One lock guards the replica table and every record in it. Each live replica
has a watcher thread that waits on its process (so an exit is seen at once)
and, until the replica is ready, probes its HTTP endpoints every
``ready_poll_seconds`` and as soon as the engine writes to its log
(``probe.ProbeSchedule``).

Engines run in their own session (``start_new_session``), so they survive a
restart of the agent. The table is written to a state file on every change
(``state_file.py``);
an agent that starts again re-adopts the replicas whose processes are still
alive (checked by pid *and* start time, so that a reused pid is not mistaken
for the engine), and marks the others failed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from llmgw_policy import Policy, check_spec, default_policy

from . import attempts, ranks, state_file, stopping
from .config import AgentConfig, CardConfig
from .probe import ProbeSchedule, in_flight, probe
from .process import (
    AdoptedProcess,
    ChildProcess,
    describe_exit,
    group_alive,
    port_free,
    proc_stat,
    redacted,
    signal_group,
)
from .record import FAILED, LOADING, READY, STARTING, STOPPED, Replica, now_iso
from .spec import AgentError, Spec, engine_env, parse_spec

log = logging.getLogger("llmgw_agent")

MAX_FINISHED_RECORDS = 500
LOG_MAX_LINES = 500  # lines a log request may ask for (read from the log's last 64 KiB)
LOG_MIN_INTERVAL = 0.5  # seconds between two reads of one replica's log, however often it is asked
# The longest a reader may wait for a replica to change (GET ...?wait=): bounded, so a connection
# is never held open for long, whatever the caller asked.
MAX_WAIT_SECONDS = 30.0


class Supervisor:
    """The replicas of one node: the only code that starts or stops engines."""

    def __init__(
        self,
        config: AgentConfig,
        cards: tuple[CardConfig, ...],
        *,
        policy: Policy | None = None,
        probe: Callable[..., tuple[str, str]] = probe,
        in_flight: Callable[[int], int | None] = in_flight,
    ):
        self.config = config
        self.cards = cards
        self.policy = policy or default_policy()
        # Programs are found on the agent's own PATH, as it was when the agent
        # started: a spec cannot name another (PATH is refused in a spec).
        self.program_path = os.environ.get("PATH", os.defpath)
        self._probe = probe
        self._in_flight = in_flight
        # A condition on the table's lock: every change of a replica is saved (_save), and saving
        # wakes the readers waiting for one (get with wait).
        self._lock = threading.Condition()
        self._replicas: dict[str, Replica] = {}
        # The table as last saved (its version, its rows), and the version the file holds: a change
        # is taken under the table's lock, the file written after it is let go (_write_saved), so
        # the file's write never holds up a start, a stop or a reader (docs/benchmarks.md).
        self._saved: tuple[int, list[dict[str, Any]]] = (0, [])
        self._written = 0
        self._file_lock = threading.Lock()
        self._log_cache: dict[str, tuple[float, int, list[str]]] = {}  # replica: (read at, lines, tail)
        self._closing = False
        config.log_dir.mkdir(parents=True, exist_ok=True)
        config.state_file.parent.mkdir(parents=True, exist_ok=True)

    # -- reads --

    def node(self) -> list[dict[str, Any]]:
        with self._lock:
            holders = {
                card: rec.id
                for rec in self._replicas.values()
                if rec.holds_resources
                for card in rec.spec.cards
            }
        return [
            {"index": c.index, "name": c.name, "memory_mib": c.memory_mib, "replica": holders.get(c.index)}
            for c in self.cards
        ]

    def attempts(self, replica_id: str) -> dict[str, Any]:
        """The start attempts whose logs are kept (attempts.py), oldest first."""
        with self._lock:
            record = self._find(replica_id)
        return {
            "id": replica_id,
            "attempts": attempts.describe(self.config.log_dir, replica_id, record.log_path),
        }

    def log(self, replica_id: str, lines: int, attempt: int | None = None) -> dict[str, Any]:
        """The last ``lines`` lines (at most ``LOG_MAX_LINES``, read from the last 64 KiB) this run of
        the replica wrote to its log, with the spec's secrets replaced by ``***``. Read from the file
        at most every ``LOG_MIN_INTERVAL`` seconds per replica, however often it is asked (a page
        polls while the replica starts): the last answer is given meanwhile. ``attempt``: a kept
        earlier attempt's log instead (``attempts``), redacted with the current spec's secrets."""
        lines = max(1, min(lines, LOG_MAX_LINES))
        with self._lock:
            record = self._find(replica_id)
            state = record.state
        if attempt is not None:
            path = attempts.kept(self.config.log_dir, replica_id, attempt)
            if path != record.log_path:
                tail = record.redact_lines(attempts.tail_of(path, lines))
                return {"id": replica_id, "state": state, "attempt": attempt, "lines": tail}
        now = time.monotonic()
        cached = self._log_cache.get(replica_id)
        if cached is not None and now - cached[0] < LOG_MIN_INTERVAL and cached[1] >= lines:
            tail = cached[2][-lines:]
        else:
            tail = record.redact_lines(record.log_tail(lines))
            self._log_cache[replica_id] = (now, lines, tail)
        return {"id": replica_id, "state": state, "lines": tail}

    def process_groups(self) -> dict[int, str]:
        """The process group of each replica whose process runs: ``{pgid: replica id}`` (an engine
        leads its own group, so its workers are in it too)."""
        with self._lock:
            return {
                rec.handle.pid: rec.id
                for rec in self._replicas.values()
                if rec.handle is not None and not rec.done.is_set()
            }

    def all_replicas(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._replicas[rid].as_dict() for rid in sorted(self._replicas)]

    def get(self, replica_id: str, *, wait: float = 0.0, unless: str | None = None) -> dict[str, Any]:
        """The replica's state. With ``unless`` (the state the caller last saw) and ``wait``
        seconds: answers as soon as the state is another one, or once ``wait`` has passed (or
        the agent is shutting down) with the state then, so a caller learns that a replica is
        ready when it is, without polling."""
        deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT_SECONDS)
        with self._lock:
            record = self._find(replica_id)
            while unless is not None and record.state == unless and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
                record = self._replicas.get(replica_id, record)
            return record.as_dict()

    # -- start --

    def start(self, replica_id: str, body: Any) -> tuple[int, dict[str, Any]]:
        """Start the replica ``body`` describes; (201, state) when a process was
        started, (200, state) when the same spec is already live."""
        spec = parse_spec(body)
        engine = self.config.engines.get(spec.engine)
        if engine is None:
            known = ", ".join(sorted(self.config.engines))
            raise AgentError(
                400,
                "unknown_engine",
                f"Engine {spec.engine!r} is not configured on this node (known: {known}).",
            )
        if spec.engine not in self.policy.engines:
            raise AgentError(
                400,
                "unknown_engine",
                f"Engine {spec.engine!r} is configured on this node but not in the launch policy "
                f"{self.policy.path}, so nobody has said which of its arguments are safe.",
            )
        refusals = check_spec(
            self.policy,
            spec.engine,
            list(spec.args),
            list(spec.env),
            port=spec.port,
            model=spec.model,
            roots=self.config.model_roots,
            group=spec.group,
        )
        if refusals:
            code = "refused_arg" if refusals[0].code == "too_large" else refusals[0].code
            raise AgentError(400, code, refusals[0].sentence)
        known_cards = {card.index for card in self.cards}
        missing = [card for card in spec.cards if card not in known_cards]
        if missing:
            have = ", ".join(str(i) for i in sorted(known_cards)) or "none"
            raise AgentError(
                400,
                "unknown_card",
                f"Card {missing[0]} does not exist on node {self.config.node} (cards: {have}).",
            )
        if self.config.port in ranks.bound_ports(spec, self.policy):
            raise AgentError(409, "port_busy", f"Port {self.config.port} is the agent's own port.")

        with self._lock:
            if self._closing:
                raise AgentError(
                    503, "shutting_down", "The agent is shutting down; try again when it is back."
                )
            current = self._replicas.get(replica_id)
            if current is not None and current.holds_resources:
                if current.stopping or current.timed_out or not current.live:
                    raise AgentError(
                        409,
                        "stopping",
                        f"Replica {replica_id} is being stopped; start it again once it has stopped.",
                    )
                if current.spec.runs_same_as(spec):
                    return 200, current.as_dict()
                raise AgentError(
                    409,
                    "spec_conflict",
                    f"Replica {replica_id} is {current.state} with a different spec; stop it first, or use another id.",
                )
            others = [o for o in self._replicas.values() if o.id != replica_id and o.holds_resources]
            for other in others:
                busy = sorted(set(other.spec.cards) & set(spec.cards))
                if busy:
                    raise AgentError(
                        409,
                        "card_busy",
                        f"Card {busy[0]} is held by replica {other.id} ({other.state}); pick a free card or stop it first.",
                    )
            taken = ranks.port_refusal(
                spec, [(o.id, o.state, o.spec) for o in others], self.config.node, port_free, self.policy
            )
            if taken is not None:
                raise taken
            record = self._launch(replica_id, spec, engine.command)
            self._replicas[replica_id] = record
            self._prune()
            self._save()
            started = record.as_dict()
        self._write_saved()  # in the file before the start is answered
        return 201, started

    def _api_key(self, spec: Spec) -> str:
        """The replica's own API key (the spec's variable the policy marks ``api_key``), which its
        readiness probe sends as a client would; '' when it has none."""
        names = self.policy.api_key_env(spec.engine)
        return next((value for name, value in spec.env if name in names and value), "")

    def _secrets(self, spec: Spec) -> tuple[str, ...]:
        names = self.policy.secret_env(spec.engine)
        return tuple(value for name, value in spec.env if name in names and len(value) >= 4)

    def _launch(self, replica_id: str, spec: Spec, command: tuple[str, ...]) -> Replica:
        """Start the process (called with the lock held, so that two PUTs cannot
        both take the same cards)."""
        program = command[0] if "/" in command[0] else shutil.which(command[0], path=self.program_path)
        argv = [program or command[0], *command[1:], *spec.args]
        env = engine_env(replica_id, spec, self.program_path)

        log_path = attempts.start_attempt(
            self.config.log_dir,
            replica_id,
            keep=self.config.log_attempts,
            max_bytes=self.config.log_attempt_bytes,
        )
        started_at = now_iso()
        with log_path.open("ab") as log_file:
            offset = log_file.tell()
            header = (
                f"{started_at} llmgw-agent: starting replica {replica_id} on cards "
                f"[{env['CUDA_VISIBLE_DEVICES']}] port {spec.port}: {json.dumps(redacted(argv))}"
                f" (spec env: {', '.join(name for name, _ in spec.env) or 'none'})\n"
            )
            log_file.write(header.encode())
            log_file.flush()
            record = Replica(
                id=replica_id,
                spec=spec,
                state=STARTING,
                log_path=log_path,
                log_offset=offset,
                started_at=started_at,
                ready_deadline=time.time() + spec.ready_timeout,
                reason="process started; /health is not answering yet",
                secrets=self._secrets(spec),
            )
            try:
                if program is None:
                    raise FileNotFoundError(
                        2, f"{command[0]} is not on the agent's PATH ({self.program_path})"
                    )
                popen = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                record.state = FAILED
                record.finished_at = now_iso()
                record.reason = f"could not start {argv[0]}: {exc.strerror or exc}"
                log_file.write(f"llmgw-agent: {record.reason}\n".encode())
                record.done.set()
                log.warning("replica %s: %s", replica_id, record.reason)
                return record
        record.handle = ChildProcess(popen)
        record.pid = popen.pid
        stat = proc_stat(popen.pid)
        record.starttime = stat[1] if stat else None
        log.info(
            "replica %s: started pid %s (%s on cards %s, port %s)",
            replica_id,
            popen.pid,
            spec.engine,
            list(spec.cards),
            spec.port,
        )
        self._watch_in_background(record)
        return record

    # -- stop --

    def stop(
        self,
        replica_id: str,
        grace: float | None = None,
        *,
        drain: float | None = None,
        why: str = "stopped through the API",
    ) -> dict[str, Any]:
        """Stop the replica and answer once its process is gone: a ready engine is drained first
        (``_drain``: up to ``drain`` seconds for its requests in flight), then SIGTERM to its
        process group, SIGKILL after ``grace`` seconds. Stopping a replica that is not running is
        harmless; a stop asked for while one is under way waits for that one."""
        grace = self.config.stop_grace_seconds if grace is None else grace
        drain = self.config.stop_drain_seconds if drain is None else drain
        with self._lock:
            record = self._find(replica_id)
            if record.handle is None or record.done.is_set():
                return record.as_dict()
            already = record.stopping
            record.stopping = True
            if not already:
                record.stop_reason = why
                # A headless rank serves nothing to drain (its port is rank 0's).
                record.draining = record.state == READY and drain > 0 and not record.spec.headless
                self._save()
        self._write_saved()
        if already:
            record.done.wait(timeout=drain + grace + stopping.KILL_WAIT * 2)
            return self.get(replica_id)
        if record.draining:
            self._drain(record, drain)
        self._terminate(record, grace)
        record.done.wait(timeout=stopping.KILL_WAIT * 2)
        return self.get(replica_id)

    def _drain(self, record: Replica, drain: float) -> None:
        """Before SIGTERM: wait up to ``drain`` seconds for the engine's requests in flight
        (``stopping.drain``), and say in the stop's reason how it went. The replica answers
        ``draining`` meanwhile."""
        note = stopping.drain(record, drain, self._in_flight)
        log.info("replica %s: %s", record.id, note or "no request in flight")
        with self._lock:
            record.stop_reason += f" ({note})" if note else ""
            record.draining = False

    def _terminate(self, record: Replica, grace: float) -> None:
        def killed() -> None:
            with self._lock:
                record.killed_after_grace = grace

        stopping.terminate(record, grace, killed)

    def shutdown(self, *, stop_children: bool) -> None:
        """Refuse new starts; stop every live replica first if ``stop_children``."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()  # waiting readers answer now
            live = [
                rec for rec in self._replicas.values() if rec.handle is not None and not rec.done.is_set()
            ]
        if stop_children and live:
            threads = [
                threading.Thread(target=self.stop, args=(rec.id,), kwargs={"why": "stopped with the agent"})
                for rec in live
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        with self._lock:
            self._save()
        self._write_saved()

    # -- watching --

    def _watch_in_background(self, record: Replica) -> None:
        threading.Thread(target=self._watch, args=(record,), name=f"watch-{record.id}", daemon=True).start()

    def _watch(self, record: Replica) -> None:
        handle = record.handle
        assert handle is not None
        schedule = ProbeSchedule(record.log_path, self.config.ready_poll_seconds)
        starting = True
        while not handle.wait(schedule.look if starting else schedule.poll):
            with self._lock:
                starting = not (record.stopping or record.timed_out) and record.state in (STARTING, LOADING)
                if not starting:
                    continue
                overdue = time.time() > record.ready_deadline
                if overdue:
                    record.timed_out = True
            if not (overdue or schedule.due()):
                continue
            if overdue:
                log.warning(
                    "replica %s: not ready within %gs; stopping it", record.id, record.spec.ready_timeout
                )
                self._terminate(record, self.config.stop_grace_seconds)
                continue
            try:
                state, reason = (
                    (READY, ranks.headless_reason(record.spec))
                    if record.spec.headless
                    else self._probe(record.spec.port, record.spec.model, api_key=self._api_key(record.spec))
                )
            except Exception as exc:  # a probe must never kill the watcher
                log.exception("replica %s: readiness probe failed", record.id)
                state, reason = LOADING, f"readiness probe failed: {exc}"
            with self._lock:
                if (
                    record.stopping
                    or record.timed_out
                    or record.state not in (STARTING, LOADING)
                    or handle.exited()
                ):
                    continue
                if (state, reason) != (record.state, record.reason):
                    record.state, record.reason = state, reason
                    if state == READY:
                        record.ready_at = now_iso()
                        log.info("replica %s: ready", record.id)
                    self._save()
            self._write_saved()
        self._finished(record)

    def _finished(self, record: Replica) -> None:
        handle = record.handle
        assert handle is not None
        code = handle.exit_code()
        if not (record.stopping or record.timed_out) and group_alive(handle.pid):
            # The engine died on its own; whatever it left behind in its
            # process group (workers holding GPU memory) is of no use now.
            signal_group(handle.pid, signal.SIGKILL)
        with self._lock:
            was = record.state
            record.exit_code = code
            record.finished_at = now_iso()
            if record.stopping:
                record.state = STOPPED
                record.reason = record.stop_reason
                if record.killed_after_grace is not None:
                    record.reason += f"; killed with SIGKILL after {record.killed_after_grace:g}s without exiting on SIGTERM"
            elif record.timed_out:
                record.state = FAILED
                record.reason = f"not ready within {record.spec.ready_timeout:g}s; stopped by the agent ({was}: {record.reason})"
            else:
                record.state = FAILED
                when = "after it was ready" if was == READY else f"while {was}"
                if record.adopted and code is None:
                    record.reason = (
                        f"exited {when} (not started by this run of the agent, so its exit code is unknown)"
                    )
                else:
                    record.reason = f"exited on its own {when}: {describe_exit(code)}"
                line = ranks.engine_line(record.log_tail()) if record.spec.group is not None else ""
                if line:  # a rank says why in its log (its group lost a rank, a rendezvous timed out)
                    record.reason += f"; the engine's last line: {line}"
            record.done.set()
            self._save()
        self._write_saved()
        log.info("replica %s: %s (%s)", record.id, record.state, record.reason)

    # -- state file --

    def adopt(self) -> int:
        """Load the state file of an earlier run: re-adopt the engines that are
        still running, mark the others failed. Returns how many were adopted."""
        records = state_file.read(self.config.state_file, self._secrets)
        if records is None:
            return 0
        adopted = 0
        with self._lock:
            for record in records:
                self._replicas[record.id] = record
                if record.live:
                    stat = proc_stat(record.pid) if record.pid else None
                    if (
                        stat
                        and record.pid is not None
                        and record.starttime is not None
                        and stat[1] == record.starttime
                        and stat[0] not in "ZX"
                    ):
                        record.handle = AdoptedProcess(record.pid, record.starttime)
                        record.adopted = True
                        adopted += 1
                        log.info(
                            "replica %s: adopted running pid %s (%s)", record.id, record.pid, record.state
                        )
                        self._watch_in_background(record)
                    else:
                        record.reason = f"exited while the agent was not running, exit code unknown (it was {record.state})"
                        record.state = FAILED
                        record.finished_at = now_iso()
                        record.done.set()
                        log.warning("replica %s: %s", record.id, record.reason)
                else:
                    record.done.set()
            self._save()
        self._write_saved()
        return adopted

    def _save(self) -> None:
        """Take the table as it now is for the state file (lock held), and wake the readers waiting
        for a change. The caller writes it once it has let the lock go (``_write_saved``)."""
        self._lock.notify_all()
        version = self._saved[0] + 1
        self._saved = (version, [rec.as_state() for rec in self._replicas.values()])

    def _write_saved(self) -> None:
        """Write the table as last saved, unless the file holds it or a later one already (a
        thread that saved after this one may have written first): atomically, a crash mid-write
        leaves the previous version. Called without the table's lock, after a ``_save``; returns
        once the file holds this thread's change or a later one.

        Under the table's lock the write held up every start, stop and reader of the node for
        as long as the file took (a slow disk, every request), and on a node that keeps its 500
        finished replicas, 15 ms of CPU each change, however quiet."""
        with self._file_lock:
            version, rows = self._saved  # one reference, read whole: the table's lock is not needed
            if version <= self._written:
                return
            state_file.write(self.config.state_file, self.config.node, rows)
            self._written = version

    def _prune(self) -> None:
        finished = [rec for rec in self._replicas.values() if not rec.holds_resources]
        if len(finished) > MAX_FINISHED_RECORDS:
            finished.sort(key=lambda rec: rec.finished_at or "")
            for rec in finished[: len(finished) - MAX_FINISHED_RECORDS]:
                del self._replicas[rec.id]

    def _find(self, replica_id: str) -> Replica:
        record = self._replicas.get(replica_id)
        if record is None:
            raise AgentError(404, "not_found", f"No replica {replica_id[:140]!r} on node {self.config.node}.")
        return record
