"""An agent that hangs: a real socket on 127.0.0.1 that accepts every connection and never answers."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class HungAgent:
    url: str
    accepted: list[float] = field(default_factory=list)  # time.time() of each connection accepted


@contextlib.contextmanager
def hung_agent() -> Iterator[HungAgent]:
    """Listen on a free port of 127.0.0.1, accept connections, read nothing, answer nothing; each
    connection is held open until the block ends."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(128)
    server.settimeout(0.1)
    agent = HungAgent(url=f"http://127.0.0.1:{server.getsockname()[1]}")
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            agent.accepted.append(time.time())
            held.append(conn)

    thread = threading.Thread(target=accept, name="hung-agent", daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        done.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()
