"""Just enough HTTP/1.1 for the stand-in engine, on ``socketserver`` alone (standard library only,
imported by standin_engine.py, beside it).

Not ``http.server``: importing it (with the ``email`` and ``http.client`` modules it imports) is
some 25 ms of a stand-in's CPU at its start, the largest part of it, and the fan-out benchmark
starts sixteen stand-ins at once on the two cores it measures the control plane on. What the
stand-in's handler uses of ``BaseHTTPRequestHandler`` is here: ``command``, ``path``,
``headers.get`` (a header's name in any case), ``rfile``, ``wfile``, ``send_response``,
``send_header`` and ``end_headers``, and the ``do_<METHOD>`` methods; connections persist as
HTTP/1.1 has them, closed after an answer when the client asks for it or speaks HTTP/1.0. An
answer goes out in one write once its method returns. The server sleeps until a connection or
its shutdown, rather than waking every poll interval: a fleet's benchmark keeps some hundred
stand-ins idle beside the control plane.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socketserver
import threading
import time
from http import HTTPStatus

# Not typing's own: importing typing costs a stand-in's start 2 ms of its CPU (mypy reads the name).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

MAX_LINE = 65536
MAX_HEADERS = 100


class Headers(dict[str, str]):
    """A request's headers by lower-cased name."""

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name.lower(), default)


class Handler(socketserver.StreamRequestHandler):
    """One connection: requests read and answered in turn until either side closes it."""

    server_version = "standin/0"
    wbufsize = -1  # buffered: the status line, headers and body leave together at the flush

    command = ""
    path = ""
    headers: Headers

    def handle(self) -> None:
        while self._one():
            pass

    def _one(self) -> bool:
        line = self.rfile.readline(MAX_LINE + 1)
        if not line:
            return False
        words = line.decode("latin-1").split()
        self._close = True
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            self._refuse(HTTPStatus.BAD_REQUEST, f"bad request line {line[:80]!r}")
            return False
        self.command, self.path, version = words
        self.headers = Headers()
        for _ in range(MAX_HEADERS + 1):
            raw = self.rfile.readline(MAX_LINE + 1)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, colon, value = raw.decode("latin-1").partition(":")
            if not colon:
                self._refuse(HTTPStatus.BAD_REQUEST, f"bad header line {raw[:80]!r}")
                return False
            self.headers[name.strip().lower()] = value.strip()
        else:
            self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many headers")
            return False
        asked = (self.headers.get("Connection") or "").lower()
        self._close = version == "HTTP/1.0" and asked != "keep-alive" or asked == "close"
        method = getattr(self, f"do_{self.command}", None)
        if method is None:
            self._refuse(HTTPStatus.NOT_IMPLEMENTED, f"no method {self.command}")
        else:
            method()
        self.wfile.flush()
        return not self._close

    def send_response(self, status: int) -> None:
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        self.wfile.write(f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1"))
        self.send_header("Server", self.server_version)
        self.send_header("Date", time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()))

    def send_header(self, name: str, value: str) -> None:
        self.wfile.write(f"{name}: {value}\r\n".encode("latin-1"))

    def end_headers(self) -> None:
        if self._close:
            self.send_header("Connection", "close")
        self.wfile.write(b"\r\n")

    def _refuse(self, status: HTTPStatus, why: str) -> None:
        payload = why.encode()
        self._close = True
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()


class Server(socketserver.ThreadingTCPServer):
    """A thread per connection, none kept alive past the process's end, the port reusable at once
    (as ``http.server.ThreadingHTTPServer``); asleep between connections, and ended at once by
    ``shutdown`` (socketserver's own loop wakes every ``poll_interval`` to see whether it was
    asked to end: ten times a second for each idle stand-in, and up to a tenth of a second late)."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[Handler]) -> None:
        super().__init__(address, handler)
        self._wake_read, self._wake_write = os.pipe()
        self._ended = threading.Event()

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Answer connections until ``shutdown`` (``poll_interval`` is not used: nothing polls).
        In the main thread, a signal wakes it too (``_woken_by_signals``), so that its handler runs."""
        try:
            with selectors.DefaultSelector() as selector, self._woken_by_signals(selector):
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake_read, selectors.EVENT_READ)
                while True:
                    events = selector.select()
                    for key, _ in events:
                        if key.data is not None:
                            key.data(key.fd)  # a signal's wakeup: read, its handler runs next
                    woken = {key.fileobj for key, _ in events}
                    if self._wake_read in woken:
                        return
                    if self in woken:
                        # What socketserver's own loop calls once the socket is readable (typeshed
                        # leaves its private methods out).
                        self._handle_request_noblock()  # type: ignore[attr-defined]
        finally:
            self._ended.set()

    @contextlib.contextmanager
    def _woken_by_signals(self, selector: selectors.BaseSelector) -> Iterator[None]:
        """While the main thread sleeps here, a signal caught by another thread wakes it. The kernel
        hands a signal sent to the process to any thread not blocking it (often one running at
        that moment: a connection's, just done answering), and Python runs the handler in the main
        thread only, once it next runs Python: asleep in ``select`` it would not, and a SIGTERM went
        unheard until the agent's SIGKILL. Python's own handler writes to the wakeup fd from any
        thread; the main thread wakes, reads it, and runs the handler before its next line."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        read, write = os.pipe()
        for fd in (read, write):
            os.set_blocking(fd, False)
        before = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        selector.register(read, selectors.EVENT_READ, _drain)
        try:
            yield
        finally:
            selector.unregister(read)
            signal.set_wakeup_fd(before)
            os.close(read)
            os.close(write)

    def shutdown(self) -> None:
        """End ``serve_forever`` (from another thread) and wait until it has returned."""
        os.write(self._wake_write, b".")
        self._ended.wait()

    def server_close(self) -> None:
        super().server_close()
        for fd in (self._wake_read, self._wake_write):
            os.close(fd)


def _drain(fd: int) -> None:
    """Read what Python's signal handler wrote to the wakeup fd (a byte a signal)."""
    with contextlib.suppress(BlockingIOError):
        os.read(fd, 512)
