"""The control plane's side of the node agent API (docs/agent-api.md).

Every failure becomes an ``AgentCallFailed`` whose message is a plain sentence an
operator can act on (the agent is down, refused the token, failed, was too
slow, refused the spec), naming the node; a restart step records it as its
reason. Nothing here touches the database.
"""

from __future__ import annotations

import functools
import os
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpcore
import httpx
from django.conf import settings

from base.errors import DomainError
from catalog.agent_address import AgentAddress, checked_address
from catalog.models import Node

# DELETE answers only once the process is gone: SIGTERM, ``grace`` seconds,
# then SIGKILL and a few seconds more (the agent waits up to 10 s for that).
STOP_MARGIN_SECONDS = 15.0


class AgentCallFailed(Exception):
    """The agent could not be used, or refused. ``code``: agent_address (its URL names an address
    outside LLMGW_AGENT_NETWORKS), agent_down, agent_slow, agent_token, agent_failed, agent_refused,
    not_found, agent_bad_answer."""

    def __init__(self, code: str, message: str, *, status: int | None = None, agent_code: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.agent_code = agent_code


@dataclass(frozen=True)
class AgentClient:
    """One node's agent: its URL, its token, and a timeout for each request."""

    node: str
    url: str
    token: str
    timeout: float

    @classmethod
    def for_node(cls, node: Node, *, timeout: float | None = None) -> AgentClient:
        return cls(
            node=node.name,
            url=node.agent_url.rstrip("/"),
            token=node.agent_token,
            timeout=settings.LLMGW_AGENT_TIMEOUT_SECONDS if timeout is None else timeout,
        )

    # -- the endpoints ------------------------------------------------------------------------

    def node_info(self) -> dict[str, Any]:
        return self._call("GET", "/v1/node", what="reading its cards")

    def rotate_token(self, new_token: str, *, grace_seconds: float) -> dict[str, Any]:
        """POST /v1/token: the agent takes ``new_token`` and accepts the old one
        for ``grace_seconds`` more."""
        return self._call(
            "POST",
            "/v1/token",
            json={"token": new_token, "grace_seconds": grace_seconds},
            what="taking a new token",
        )

    def log(self, replica_id: str, *, lines: int = 200) -> dict[str, Any]:
        """GET /v1/replicas/{id}/log: the last ``lines`` lines of its engine's log, secrets redacted."""
        return self._call(
            "GET",
            self._path(replica_id) + "/log",
            params={"lines": str(lines)},
            what=f"reading replica {replica_id}'s log",
        )

    def telemetry(self) -> dict[str, Any]:
        """GET /v1/telemetry: each card's memory, utilisation, temperature and processes."""
        return self._call("GET", "/v1/telemetry", what="reading its cards' telemetry")

    def replicas(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/replicas", what="listing its replicas")

    def start(self, replica_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        """PUT the spec: 201 started, 200 already live with the same spec (harmless)."""
        return self._call("PUT", self._path(replica_id), json=spec, what=f"starting replica {replica_id}")

    def get(self, replica_id: str, *, wait: float = 0.0, unless: str | None = None) -> dict[str, Any]:
        """The replica's state; with ``unless`` (the state last seen) and ``wait`` seconds, a long
        poll: the agent answers once the state is another, or after ``wait`` (docs/agent-api.md).
        The request's timeout is the agent's plus the wait."""
        what = f"reading the state of replica {replica_id}"
        if unless is None or wait <= 0:
            return self._call("GET", self._path(replica_id), what=what)
        return self._call(
            "GET",
            self._path(replica_id),
            params={"wait": f"{wait:.3f}", "state": unless},
            what=what,
            timeout=self.timeout + wait,
        )

    def stop(self, replica_id: str, *, grace: float | None = None) -> dict[str, Any]:
        """DELETE: answers once the process is gone. A replica the agent does not
        know is as stopped as it gets: answered as such, not as an error."""
        params = {} if grace is None else {"grace": f"{grace:g}"}
        # LLMGW_AGENT_STOP_SECONDS bounds the agent's own grace; a grace asked for gets its margin.
        wait = settings.LLMGW_AGENT_STOP_SECONDS if grace is None else grace + STOP_MARGIN_SECONDS
        try:
            return self._call(
                "DELETE",
                self._path(replica_id),
                params=params,
                what=f"stopping replica {replica_id}",
                timeout=max(self.timeout, wait),
            )
        except AgentCallFailed as exc:
            if exc.code == "not_found":
                return {"id": replica_id, "state": "stopped", "reason": "the agent does not know it"}
            raise

    # -- plumbing ------------------------------------------------------------------------------

    @staticmethod
    def _path(replica_id: str) -> str:
        return "/v1/replicas/" + quote(replica_id, safe="")

    def _call(
        self,
        method: str,
        path: str,
        *,
        what: str,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        timeout = self.timeout if timeout is None else timeout
        who = f"The agent of node {self.node} ({self.url})"
        try:
            # Resolved and checked once: the connection goes to this address, not to a second lookup's.
            target = checked_address(self.url)
        except DomainError as exc:
            raise AgentCallFailed(
                "agent_address", f"{who} was not called while {what}: {exc.message}"
            ) from None
        try:
            # trust_env=False: an agent is reached directly, never through a proxy from the environment.
            # https agents are checked against LLMGW_AGENT_CA_BUNDLE when it is set.
            context = _verify()
            with httpx.Client(
                timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
                trust_env=False,
                verify=context,
                transport=PinnedTransport(target, ssl_context=context),
            ) as http:
                response = http.request(
                    method,
                    self.url + path,
                    json=json,
                    params=params,
                    headers={"Authorization": f"Bearer {self.token}"},
                )
        except httpx.ConnectTimeout:
            raise AgentCallFailed(
                "agent_down",
                f"{who} could not be reached within {min(timeout, 5.0):g} s while {what}: is the node up?",
            ) from None
        except httpx.TimeoutException:
            raise AgentCallFailed(
                "agent_slow", f"{who} did not answer within {timeout:g} s while {what}."
            ) from None
        except httpx.ConnectError as exc:
            if "CERTIFICATE_VERIFY_FAILED" in str(exc) or "certificate verify failed" in str(exc):
                raise AgentCallFailed(
                    "agent_untrusted",
                    f"{who} presented a certificate that is not trusted while {what}: set "
                    "LLMGW_AGENT_CA_BUNDLE to the CA bundle that signed the agents' certificates.",
                ) from None
            refused = "refused" in str(exc).lower()
            raise AgentCallFailed(
                "agent_down",
                f"{who} refused the connection while {what}: is the agent running?"
                if refused
                else f"{who} could not be reached while {what}: {exc}.",
            ) from None
        except httpx.TransportError as exc:
            raise AgentCallFailed(
                "agent_down", f"{who} broke off the connection while {what}: {exc}."
            ) from None

        body: Any
        try:
            body = response.json()
        except ValueError:
            body = None
        detail, code = "", ""
        if isinstance(body, dict):
            detail, code = str(body.get("detail", "")), str(body.get("code", ""))
        if response.status_code == 401:
            raise AgentCallFailed(
                "agent_token",
                f"{who} refused the token while {what}: the node's agent token in the "
                "catalog is not the one the agent expects.",
                status=401,
                agent_code=code,
            )
        if response.status_code == 404 and code == "not_found":
            raise AgentCallFailed(
                "not_found", f"{who} does not know it ({what}): {detail}", status=404, agent_code=code
            )
        if response.status_code >= 500:
            said = detail or response.text.strip()[:200] or "no explanation"
            raise AgentCallFailed(
                "agent_failed",
                f"{who} failed while {what} (HTTP {response.status_code}): {said}",
                status=response.status_code,
                agent_code=code,
            )
        if response.status_code >= 400:
            said = detail or response.text.strip()[:200] or "no explanation"
            raise AgentCallFailed(
                "agent_refused",
                f"{who} refused {what} (HTTP {response.status_code}{', ' + code if code else ''}): {said}",
                status=response.status_code,
                agent_code=code,
            )
        if body is None:
            raise AgentCallFailed(
                "agent_bad_answer",
                f"{who} answered {what} with something that is not JSON "
                f"(HTTP {response.status_code}): is that URL really a node agent?",
                status=response.status_code,
            )
        return body


class _PinnedBackend(httpcore.NetworkBackend):
    """Connects to the checked address whatever host the URL names: the URL, and with it the Host
    header and the TLS server name (SNI and the certificate's check), stay the agent URL's."""

    def __init__(self, target: AgentAddress):
        self.target = target
        self.backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        if host.strip("[]").lower() != self.target.host.strip("[]"):
            raise httpcore.ConnectError(f"{host} is not the host whose address was checked")
        return self.backend.connect_tcp(
            str(self.target.address), port, timeout, local_address, socket_options
        )

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> Any:
        raise httpcore.ConnectError("an agent is reached over TCP only")

    def sleep(self, seconds: float) -> None:
        self.backend.sleep(seconds)


class PinnedTransport(httpx.HTTPTransport):
    """httpx's transport with its connections pinned to one checked address (``_PinnedBackend``)."""

    def __init__(self, target: AgentAddress, *, ssl_context: ssl.SSLContext):
        super().__init__(verify=ssl_context, trust_env=False)
        self._pool = httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=_PinnedBackend(target))


def _verify() -> ssl.SSLContext:
    """The TLS context agent calls use: made once per CA bundle (as the file is), not per call.
    httpx builds a context for every client it is handed ``True``, reading the whole CA store
    each time: some 18 ms of CPU per agent call, a tenth of a restart step's own work."""
    bundle = settings.LLMGW_AGENT_CA_BUNDLE
    if not bundle:
        return _context("", 0, 0)
    try:
        stat = os.stat(bundle)
    except OSError:
        return ssl.create_default_context(cafile=bundle)  # says what is wrong with it
    return _context(bundle, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _context(bundle: str, mtime_ns: int, size: int) -> ssl.SSLContext:
    # An SSLContext may be shared by threads; the bundle's time and size key it, so a new one is read.
    # Without a bundle, httpx's own default (certifi's store), as ``verify=True`` gave.
    return ssl.create_default_context(cafile=bundle) if bundle else httpx.create_ssl_context(trust_env=False)


def describe_failure(state: dict[str, Any], *, lines: int = 8) -> str:
    """A failed replica in a sentence: the agent's reason, exit code, last log lines."""
    parts = [str(state.get("reason") or "failed")]
    code = state.get("exit_code")
    if code is not None and "exit code" not in parts[0] and "killed by" not in parts[0]:
        parts.append(f"exit code {code}")
    tail = [line for line in state.get("log_tail") or [] if line.strip()][-lines:]
    text = "; ".join(parts)
    if tail:
        text += ". Last lines of its log:\n" + "\n".join(tail)
    return text
