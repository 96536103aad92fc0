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
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from . import __version__
from .config import AgentConfig
from .record import FAILED, LOADING, READY, STARTING, STOPPED
from .spec import AgentError, check_replica_id
from .supervisor import MAX_WAIT_SECONDS, Supervisor

ALL_STATES = frozenset({STARTING, LOADING, READY, FAILED, STOPPED})

log = logging.getLogger("llmgw_agent")

MAX_BODY = 1 << 20
REPLICAS_PREFIX = "/v1/replicas/"


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, config: AgentConfig, supervisor: Supervisor, cards_source: str):
        self.address_family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self.config = config
        self.supervisor = supervisor
        self.cards_source = cards_source
        self._token = config.token.encode("utf-8")
        super().__init__((config.host, config.port), AgentHandler)

    def authorized(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(credentials.strip().encode("utf-8", "replace"), self._token)


class AgentHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"llmgw-agent/{__version__}"
    sys_version = ""
    server: AgentServer

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
            }
        if path in ("/v1/replicas", "/v1/replicas/"):
            self._allow(method, "GET")
            return 200, supervisor.all_replicas()
        if path.startswith(REPLICAS_PREFIX) and "/" not in path[len(REPLICAS_PREFIX) :]:
            replica_id = unquote(path[len(REPLICAS_PREFIX) :])
            self._allow(method, "GET", "PUT", "DELETE")
            if method == "GET":
                wait, unless = _wait(query)
                return 200, supervisor.get(replica_id, wait=wait, unless=unless)
            if method == "DELETE":
                return 200, supervisor.stop(replica_id, _grace(query))
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
