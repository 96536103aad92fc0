"""The stand-in engine's HTTP (standin_http.py, in place of http.server for its start's cost): what
the agent's probes, the control plane and a gateway's clients send it is answered as HTTP/1.1
has it. A real stand-in process over 127.0.0.1, standard library only like the agent."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import unittest
from pathlib import Path

from agent_testing import STANDIN, free_port, wait_until


class StandinHttpTest(unittest.TestCase):
    port: int
    process: subprocess.Popen[bytes]

    @classmethod
    def setUpClass(cls) -> None:
        cls.port = free_port()
        cls.process = listening_standin(cls.port, {"VLLM_API_KEY": "sk-standin"})

    @classmethod
    def tearDownClass(cls) -> None:
        cls.process.kill()
        cls.process.wait()

    def test_one_connection_carries_several_requests(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        self.addCleanup(connection.close)
        bodies = []
        for _ in range(3):
            connection.request("GET", "/health")
            answer = connection.getresponse()
            bodies.append((answer.status, json.loads(answer.read()), answer.getheader("Connection")))
        self.assertEqual(bodies, [(200, {"status": "ok"}, None)] * 3)
        body = json.dumps({"model": "m", "prompt": "hello there", "max_tokens": 1})
        connection.request(
            "POST",
            "/v1/completions",
            body=body,
            headers={"AUTHORIZATION": "Bearer sk-standin", "content-type": "application/json"},
        )
        answer = connection.getresponse()
        self.assertEqual(answer.status, 200)
        self.assertEqual(json.loads(answer.read())["choices"][0]["text"], "echo:")

    def test_a_client_asking_to_close_is_answered_then_closed(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            received = _until_closed(sock)
        head, _, body = received.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 401 Unauthorized\r\n"), head)
        self.assertIn(b"\r\nConnection: close", head)
        self.assertEqual(json.loads(body), {"error": "Unauthorized"})

    def test_http_1_0_is_closed_after_its_answer(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            received = _until_closed(sock)
        self.assertTrue(received.startswith(b"HTTP/1.1 200 OK\r\n"), received)
        self.assertTrue(received.endswith(b'{"status": "ok"}'), received)

    def test_a_request_line_that_is_not_http_is_refused_and_closed(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(b"HELLO\r\n\r\n")
            received = _until_closed(sock)
        self.assertTrue(received.startswith(b"HTTP/1.1 400 Bad Request\r\n"), received)
        self.assertIn(b"bad request line", received)

    def test_a_method_it_does_not_serve_answers_501(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        self.addCleanup(connection.close)
        connection.request("DELETE", "/v1/models")
        answer = connection.getresponse()
        self.assertEqual((answer.status, answer.read()), (501, b"no method DELETE"))


class StandinAsleepTest(unittest.TestCase):
    def test_an_idle_stand_in_sleeps_until_a_request_and_ends_on_sigterm(self) -> None:
        port = free_port()
        process = listening_standin(port)
        self.addCleanup(process.wait)
        self.addCleanup(process.kill)
        time.sleep(0.3)  # the connection above answered
        before = _wakeups(process.pid)
        time.sleep(1.0)
        # Polling for its shutdown, socketserver's loop woke ten times a second.
        self.assertLessEqual(
            _wakeups(process.pid) - before, 2, "the idle stand-in's main thread kept waking up"
        )
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/health")
        self.assertEqual(connection.getresponse().status, 200)
        connection.close()
        process.send_signal(signal.SIGTERM)
        self.assertEqual(process.wait(timeout=10), 0)


class StandinSignalTest(unittest.TestCase):
    def test_sigterm_caught_by_another_thread_still_ends_the_server(self) -> None:
        # The kernel hands a signal sent to the process to any of its threads that does not block
        # it, often one running at that moment: a connection's thread just done answering the
        # agent's last probe, say. Python runs the handler in the main thread only, the next time
        # it runs Python; asleep until a connection, it would never, and the agent killed the
        # stand-in after its grace (seen once in some 3,000 stops in the fan-out benchmark). Here
        # the signal is sent to a thread other than the main one on purpose.
        script = (
            "import signal, sys, threading, time\n"
            "import standin_http\n"
            "server = standin_http.Server(('127.0.0.1', 0), standin_http.Handler)\n"
            "def on_sigterm(*_):\n"
            "    threading.Thread(target=server.shutdown, daemon=True).start()\n"
            "signal.signal(signal.SIGTERM, on_sigterm)\n"
            "def elsewhere():\n"
            "    time.sleep(0.3)\n"
            "    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)\n"
            "threading.Thread(target=elsewhere).start()\n"
            "server.serve_forever()\n"
            "server.server_close()\n"
            "print('ended', flush=True)\n"
        )
        process = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                f"import sys; sys.path.insert(0, {str(STANDIN.parent)!r})\n{script}",
            ],
            stdout=subprocess.PIPE,
        )
        self.addCleanup(process.wait)
        self.addCleanup(process.kill)
        try:
            out, _ = process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.fail("the server slept on after a SIGTERM its main thread did not catch")
        self.assertEqual((process.returncode, out), (0, b"ended\n"))


def listening_standin(port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A stand-in serving model "m" on ``port``, loaded at once, once it accepts connections."""
    process = subprocess.Popen(
        [
            sys.executable,
            str(STANDIN),
            "--port",
            str(port),
            "--served-model-name",
            "m",
            "--load-seconds",
            "0",
        ],
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    wait_until(answers, timeout=20, what="the stand-in to listen")
    return process


def _wakeups(pid: int) -> int:
    """How many times the process's main thread has gone to sleep and woken (voluntary switches)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches in /proc/{pid}/status")


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a timeout fails the test)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


if __name__ == "__main__":
    unittest.main()
