"""The agent's HTTP API (see docs/agent-api.md): JSON in and out, a bearer
token on every endpoint but /healthz, one error shape.

Request log lines carry the method, path, status and duration, never headers:
the Authorization header must not reach a log.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import re
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from . import __version__
from .config import AgentConfig
from .facts import NodeFacts
from .record import FAILED, LOADING, READY, STARTING, STOPPED
from .spec import AgentError, check_replica_id
from .supervisor import MAX_WAIT_SECONDS, Supervisor
from .telemetry import Telemetry

ALL_STATES = frozenset({STARTING, LOADING, READY, FAILED, STOPPED})

log = logging.getLogger("llmgw_agent")

MAX_BODY = 1 << 20
TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
DEFAULT_GRACE = 300.0
MAX_GRACE = 7 * 24 * 3600.0
REPLICAS_PREFIX = "/v1/replicas/"


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, config: AgentConfig, supervisor: Supervisor, cards_source: str):
        self.address_family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self.config = config
        self.supervisor = supervisor
        self.cards_source = cards_source
        self.telemetry = Telemetry(supervisor.cards, supervisor.process_groups)
        self.facts = NodeFacts(config)
        self._token = config.token.encode("utf-8")
        # A rotated-out token, accepted until its deadline (time.monotonic()).
        self._previous: tuple[bytes, float] | None = None
        self._token_lock = threading.Lock()
        super().__init__((config.host, config.port), AgentHandler)
        if config.tls_cert_file is not None and config.tls_key_file is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
            # The handshake happens in the request's own thread, not in accept().
            self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ssl.SSLError | ConnectionError | TimeoutError):
            log.warning("%s: connection dropped: %s", client_address[0], exc)
            return
        super().handle_error(request, client_address)

    def authorized(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        given = credentials.strip().encode("utf-8", "replace")
        with self._token_lock:
            current, previous = self._token, self._previous
        if hmac.compare_digest(given, current):
            return True
        return (
            previous is not None
            and time.monotonic() < previous[1]
            and hmac.compare_digest(given, previous[0])
        )

    def rotate(self, body: Any) -> dict[str, Any]:
        """Take a new token: it is written to the token file first, then both
        tokens are accepted until the grace period ends, then only the new one."""
        if not isinstance(body, dict) or not isinstance(body.get("token"), str):
            raise AgentError(400, "invalid_token", 'The body must be {"token": "...", "grace_seconds": N}.')
        token = body["token"]
        if not TOKEN.fullmatch(token):
            raise AgentError(
                400, "invalid_token", "A token must be 16 to 512 letters, digits or -._~+/= (no spaces)."
            )
        grace = body.get("grace_seconds", DEFAULT_GRACE)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= MAX_GRACE:
            raise AgentError(400, "invalid_grace", f"grace_seconds must be a number from 0 to {MAX_GRACE}.")
        path = self.config.token_file
        if path is None:
            raise AgentError(
                409,
                "token_not_rotatable",
                "This agent's token comes from its configuration or environment, where a new one would not "
                "survive a restart: give the agent a token_file to rotate its token.",
            )
        tmp = path.with_name(f".{path.name}.new")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(token + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            raise AgentError(
                500, "token_not_written", f"The new token could not be written to {path}: {exc.strerror}."
            ) from None
        with self._token_lock:
            self._previous = (self._token, time.monotonic() + float(grace))
            self._token = token.encode("utf-8")
        log.info("token rotated; the previous one is accepted for %gs", grace)
        return {"rotated": True, "grace_seconds": grace}


class AgentHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"llmgw-agent/{__version__}"
    sys_version = ""
    server: AgentServer
    timeout = 60  # a client that stalls (in the TLS handshake or a request) is dropped

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    # -- dispatch --

    def _handle(self, method: str) -> None:
        started = time.monotonic()
        self._body_read = False
        url = urlsplit(self.path)
        path = url.path
        try:
            status, body = self._route(method, path, parse_qs(url.query))
        except AgentError as exc:
            status, body = exc.status, exc.as_dict()
        except Exception:
            log.exception("%s %s failed", method, path)
            status, body = (
                500,
                {"detail": "The agent failed on this request; see its log.", "code": "internal"},
            )
        self._send(status, body)
        log.info(
            '%s "%s %s" %s %.0fms',
            self.client_address[0],
            method,
            path[:200],
            status,
            (time.monotonic() - started) * 1000,
        )

    def _route(self, method: str, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        if path == "/healthz":
            self._allow(method, "GET")
            return 200, {"status": "ok"}
        if not self.server.authorized(self.headers.get("Authorization")):
            raise AgentError(
                401, "unauthorized", "A valid bearer token is required (Authorization: Bearer <token>)."
            )
        supervisor = self.server.supervisor
        if path == "/v1/node":
            self._allow(method, "GET")
            return 200, {
                "node": self.server.config.node,
                "cards": supervisor.node(),
                "agent_version": __version__,
                "cards_source": self.server.cards_source,
                "policy": supervisor.policy.digest,
                # driver_version, cuda_version, arch, engines, facts_errors (llmgw_agent/facts.py)
                **self.server.facts.get(),
            }
        if path == "/v1/telemetry":
            self._allow(method, "GET")
            return 200, {"node": self.server.config.node, **self.server.telemetry.sample()}
        if path == "/v1/token":
            self._allow(method, "POST")
            return 200, self.server.rotate(self._json_body())
        if path in ("/v1/replicas", "/v1/replicas/"):
            self._allow(method, "GET")
            return 200, supervisor.all_replicas()
        if path.startswith(REPLICAS_PREFIX) and path.endswith("/log") and path.count("/") == 4:
            replica_id = unquote(path[len(REPLICAS_PREFIX) : -len("/log")])
            self._allow(method, "GET")
            return 200, supervisor.log(replica_id, _lines(query), _attempt(query))
        if path.startswith(REPLICAS_PREFIX) and path.endswith("/attempts") and path.count("/") == 4:
            replica_id = unquote(path[len(REPLICAS_PREFIX) : -len("/attempts")])
            self._allow(method, "GET")
            return 200, supervisor.attempts(replica_id)
        if path.startswith(REPLICAS_PREFIX) and "/" not in path[len(REPLICAS_PREFIX) :]:
            replica_id = unquote(path[len(REPLICAS_PREFIX) :])
            self._allow(method, "GET", "PUT", "DELETE")
            if method == "GET":
                wait, unless = _wait(query)
                return 200, supervisor.get(replica_id, wait=wait, unless=unless)
            if method == "DELETE":
                return 200, supervisor.stop(replica_id, _grace(query), drain=_drain(query))
            check_replica_id(replica_id)
            return supervisor.start(replica_id, self._json_body())
        raise AgentError(404, "not_found", f"No endpoint {path[:200]}.")

    def _allow(self, method: str, *allowed: str) -> None:
        if method not in allowed:
            self._extra_headers = {"Allow": ", ".join(allowed)}
            raise AgentError(
                405, "method_not_allowed", f"{method} is not allowed here; use {' or '.join(allowed)}."
            )

    def _json_body(self) -> Any:
        if self.headers.get("Transfer-Encoding"):
            raise AgentError(411, "length_required", "Send the body with a Content-Length, not chunked.")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise AgentError(400, "invalid_json", "Content-Length is not a number.") from None
        if length > MAX_BODY:
            raise AgentError(
                413, "too_large", f"The body is {length} bytes; at most {MAX_BODY} are accepted."
            )
        raw = self.rfile.read(length) if length > 0 else b""
        self._body_read = True
        try:
            return json.loads(raw)
        except ValueError:
            raise AgentError(400, "invalid_json", "The body is not valid JSON.") from None

    # -- answers --

    def _send(self, status: int, body: Any) -> None:
        payload = json.dumps(body).encode("utf-8")
        # A body we did not read would be taken for the next request.
        declared = self.headers.get("Content-Length") not in (None, "0") or self.headers.get(
            "Transfer-Encoding"
        )
        if declared and not self._body_read:
            self.close_connection = True
        self.send_response(status)
        for name, value in getattr(self, "_extra_headers", {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        self._extra_headers = {}

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # _handle logs one line per request, without headers

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        log.warning("%s %s", self.client_address[0], format % args)


def _wait(query: dict[str, list[str]]) -> tuple[float, str | None]:
    """``?wait=S&state=X``: answer once the replica is no longer X, or after S seconds."""
    if "wait" not in query and "state" not in query:
        return 0.0, None
    raw, state = query.get("wait", [""])[-1], query.get("state", [""])[-1]
    try:
        wait = float(raw)
    except ValueError:
        wait = -1.0
    if not math.isfinite(wait) or not 0 <= wait <= MAX_WAIT_SECONDS:
        raise AgentError(
            400,
            "invalid_wait",
            f"wait must be a number of seconds from 0 to {MAX_WAIT_SECONDS:g}, got {raw[:40]!r}.",
        )
    if state not in ALL_STATES:
        raise AgentError(
            400,
            "invalid_state",
            f"state must be the state last seen, one of {', '.join(sorted(ALL_STATES))}; got {state[:40]!r}.",
        )
    return wait, state


def _lines(query: dict[str, list[str]]) -> int:
    """``?lines=N``: how many of the log's last lines, 1 to 500 (default 200)."""
    raw = query.get("lines", ["200"])[-1]
    if not raw.isdigit() or not 1 <= int(raw) <= 500:
        raise AgentError(
            400, "invalid_lines", f"lines must be a whole number from 1 to 500, got {raw[:40]!r}."
        )
    return int(raw)


def _drain(query: dict[str, list[str]]) -> float | None:
    """A DELETE's ``drain``: seconds to wait for the engine's requests in flight before SIGTERM."""
    if "drain" not in query:
        return None
    raw = query["drain"][-1]
    try:
        drain = float(raw)
    except ValueError:
        drain = -1.0
    if not math.isfinite(drain) or not 0 <= drain <= 3600:
        raise AgentError(
            400, "invalid_drain", f"drain must be a number of seconds from 0 to 3600, got {raw[:40]!r}."
        )
    return drain


def _attempt(query: dict[str, list[str]]) -> int | None:
    """``?attempt=N``: a kept start attempt's log instead of the current run's."""
    if "attempt" not in query:
        return None
    raw = query["attempt"][-1]
    if not raw.isdigit() or not 1 <= int(raw) <= 10**9:
        raise AgentError(400, "invalid_attempt", f"attempt must be a whole number from 1, got {raw[:40]!r}.")
    return int(raw)


def _grace(query: dict[str, list[str]]) -> float | None:
    if "grace" not in query:
        return None
    raw = query["grace"][-1]
    try:
        grace = float(raw)
    except ValueError:
        grace = -1.0
    if not math.isfinite(grace) or not 0 <= grace <= 3600:
        raise AgentError(
            400, "invalid_grace", f"grace must be a number of seconds from 0 to 3600, got {raw[:40]!r}."
        )
    return grace
