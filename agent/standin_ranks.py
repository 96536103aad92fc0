"""The stand-in engine's ranks: a replica across nodes played with a real TCP rendezvous,
standard library only (imported by standin_engine.py, beside it).

Given vLLM's rank flags (``--nnodes N --node-rank R --master-addr A --master-port P``, and
``--headless`` on every rank but 0, as the launch policy writes them), the stand-in behaves as
the group does where it matters to the control plane:

- rank 0 listens on A:P and waits for the N-1 others to join (each says which rank it is),
  up to ``STANDIN_JOIN_SECONDS`` (default 60); then it loads and serves. Too few in time: it
  exits 1 with a line like torch's TCPStore timeout ("Timed out after ... waiting for clients.
  1/2 clients joined.");
- a rank > 0 connects (retrying until the same deadline; then it exits 1 with a line like
  torch's client timeout), waits for rank 0's go, and holds the connection; it binds no port;
- once joined, when any connection drops every remaining rank exits 1 with an NCCL-like line
  (rank 0 too), so one rank lost takes the whole group down, as NCCL does (and as vLLM #32136
  says a real group may not: there the headless ranks loop on after the head died).

The lines say what happened in the engines' words; they are the stand-in's, not NCCL's own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_JOIN_SECONDS = 60.0
EXIT_CODE = 1
_RETRY = 0.2


class RendezvousFailed(Exception):
    """The group could not form; the message is the engine's line."""


@dataclass(frozen=True)
class Group:
    size: int
    rank: int
    address: str
    port: int
    headless: bool


def _value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def group_of(args: list[str]) -> Group | None:
    """The rank flags among the arguments the stand-in does not know; None without ``--nnodes``
    (or with ``--nnodes 1``). ``ValueError`` naming a flag that is missing or wrong."""
    size = _value(args, "--nnodes")
    if size is None or size == "1":
        return None
    rank, address, port = (
        _value(args, "--node-rank"),
        _value(args, "--master-addr"),
        _value(args, "--master-port"),
    )
    if not (size.isdigit() and rank is not None and rank.isdigit() and address and port and port.isdigit()):
        raise ValueError(
            "the rank flags need --nnodes N, --node-rank R, --master-addr ADDR and --master-port PORT, "
            f"got --nnodes {size} --node-rank {rank} --master-addr {address} --master-port {port}"
        )
    group = Group(int(size), int(rank), address, int(port), "--headless" in args)
    if not 0 <= group.rank < group.size:
        raise ValueError(f"--node-rank {group.rank} is not a rank of a group of {group.size}")
    if group.headless != (group.rank > 0):
        raise ValueError("--headless goes on every rank but 0, and only there")
    return group


def join_seconds() -> float:
    raw = os.environ.get("STANDIN_JOIN_SECONDS", "").strip()
    return float(raw) if raw else DEFAULT_JOIN_SECONDS


class Link:
    """The joined group's connections, as this rank holds them: rank 0 one to each other rank,
    a rank > 0 one to rank 0. ``watch`` ends the process when any of them drops."""

    def __init__(self, group: Group, peers: dict[int, socket.socket]):
        self.group = group
        self.peers = peers

    def watch(self, log: Callable[[str], None]) -> None:
        for peer, conn in self.peers.items():
            threading.Thread(target=self._hold, args=(peer, conn, log), daemon=True).start()

    def _hold(self, peer: int, conn: socket.socket, log: Callable[[str], None]) -> None:
        conn.settimeout(None)
        with contextlib.suppress(OSError):
            while conn.recv(64):
                pass
        log(
            f"ERROR rank {self.group.rank}: NCCL error: remote process exited or there was a network "
            f"error (ncclRemoteError): the connection to rank {peer} of {self.group.size} dropped; "
            "the group cannot go on, exiting"
        )
        os._exit(EXIT_CODE)


def rendezvous(group: Group, seconds: float, log: Callable[[str], None]) -> Link:
    """Form the group (rank 0 waits for the others, the others join it) within ``seconds``;
    ``RendezvousFailed`` with the engine's line when it cannot."""
    if group.rank == 0:
        return _wait_for_ranks(group, seconds, log)
    return _join(group, seconds, log)


def _wait_for_ranks(group: Group, seconds: float, log: Callable[[str], None]) -> Link:
    deadline = time.monotonic() + seconds
    try:
        server = socket.create_server((group.address, group.port))
    except OSError as exc:
        raise RendezvousFailed(
            f"torch.distributed.DistNetworkError: rank 0 cannot listen on {group.address}:{group.port} "
            f"for the group's rendezvous: {exc.strerror or exc}"
        ) from None
    log(
        f"rank 0 of {group.size}: waiting at {group.address}:{group.port} for {group.size - 1} rank(s) to join"
    )
    peers: dict[int, socket.socket] = {}
    with server:
        while len(peers) < group.size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                for conn in peers.values():
                    conn.close()
                raise RendezvousFailed(
                    f"torch.distributed.DistStoreError: Timed out after {seconds:g} seconds waiting for "
                    f"clients. {len(peers) + 1}/{group.size} clients joined."
                )
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            rank, why = _hello(conn, group, peers, left)
            if why:
                log(f"rank 0: refused a rank at the rendezvous: {why}")
                _send(conn, f"refused {why}\n")
                conn.close()
                continue
            peers[rank] = conn
            log(f"rank 0: rank {rank} joined ({len(peers) + 1}/{group.size})")
    for conn in peers.values():
        _send(conn, "go\n")
    log(f"rank 0: all {group.size} ranks joined")
    return Link(group, peers)


def _hello(
    conn: socket.socket, group: Group, peers: dict[int, socket.socket], left: float
) -> tuple[int, str]:
    """The joining rank's number, or why it may not join."""
    conn.settimeout(max(left, 0.1))
    try:
        words = conn.recv(256).decode("ascii", "replace").split()
    except OSError:
        return -1, "it said nothing"
    if len(words) != 3 or words[0] != "join" or not words[1].isdigit() or not words[2].isdigit():
        return -1, f"it did not say which rank it is ({' '.join(words)[:80]!r})"
    rank, size = int(words[1]), int(words[2])
    if size != group.size:
        return -1, f"rank {rank} thinks the group has {size} ranks, not {group.size}"
    if not 0 < rank < group.size or rank in peers:
        return -1, f"rank {rank} is not a free rank of 1 to {group.size - 1}"
    return rank, ""


def _join(group: Group, seconds: float, log: Callable[[str], None]) -> Link:
    deadline = time.monotonic() + seconds
    where = f"{group.address}:{group.port}"
    log(f"rank {group.rank} of {group.size}: joining rank 0 at {where}")
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RendezvousFailed(
                f"torch.distributed.DistNetworkError: The client socket has timed out after "
                f"{seconds:g}s while trying to connect to ({group.address}, {group.port}): rank "
                f"{group.rank} could not join its group"
            )
        try:
            conn = socket.create_connection((group.address, group.port), timeout=min(left, 2.0))
        except OSError:
            time.sleep(min(_RETRY, max(left, 0)))
            continue
        try:
            _send(conn, f"join {group.rank} {group.size}\n")
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            answer = conn.recv(256).decode("ascii", "replace").strip()
        except OSError:
            answer = ""
        if answer == "go":
            log(f"rank {group.rank}: joined the group of {group.size} at {where}")
            return Link(group, {0: conn})
        conn.close()
        raise RendezvousFailed(
            f"torch.distributed.DistNetworkError: rank {group.rank} could not join the group at "
            f"{where}: {answer or 'rank 0 closed the connection'}"
        )


def _send(conn: socket.socket, text: str) -> None:
    with contextlib.suppress(OSError):  # a rank gone meanwhile: its watcher says so
        conn.sendall(text.encode("ascii"))
