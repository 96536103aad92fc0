"""The control plane's side of the node agent API (docs/agent-api.md).

Every failure becomes an ``AgentCallFailed`` whose message is a plain sentence in the project's
words an operator can act on (the agent is down, refused the token, failed, was too slow, refused
the spec), naming the node; a restart step records it as its reason. An agent's answer is read
into the fields the API defines (``agentclient.answers``): none is shown as it came, an agent's
own sentence only when its answer has the API's error shape, cleaned, and the node's token and
the secrets the caller names are redacted from every text. Nothing here touches the database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from django.conf import settings

from agentclient import answers, transport
from base.errors import DomainError
from base.secrets import redact
from catalog.agent_address import checked_address, plaintext_refusal
from catalog.models import Node

# DELETE answers only once the process is gone: SIGTERM, ``grace`` seconds,
# then SIGKILL and a few seconds more (the agent waits up to 10 s for that).
STOP_MARGIN_SECONDS = 15.0


class AgentCallFailed(Exception):
    """The agent could not be used, or refused. ``code``: agent_address (its URL names an address
    outside LLMGW_AGENT_NETWORKS), agent_down, agent_slow, agent_untrusted, agent_token,
    agent_failed, agent_refused, not_found, agent_bad_answer."""

    def __init__(self, code: str, message: str, *, status: int | None = None, agent_code: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.agent_code = agent_code


@dataclass(frozen=True)
class AgentClient:
    """One node's agent: its URL, its token, a timeout for each request, and the secrets (besides
    the token) to redact from whatever it says: the profile's, for a replica's answers."""

    node: str
    url: str
    token: str
    timeout: float
    secrets: tuple[str, ...] = ()

    @classmethod
    def for_node(
        cls, node: Node, *, timeout: float | None = None, secrets: Iterable[str] = ()
    ) -> AgentClient:
        return cls(
            node=node.name,
            url=node.agent_url.rstrip("/"),
            token=node.agent_token,
            timeout=settings.LLMGW_AGENT_TIMEOUT_SECONDS if timeout is None else timeout,
            secrets=tuple(secrets),
        )

    # -- the endpoints ------------------------------------------------------------------------

    def node_info(self) -> dict[str, Any]:
        return self._call("GET", "/v1/node", what="reading its cards", shape=answers.node_info)

    def rotate_token(self, new_token: str, *, grace_seconds: float) -> dict[str, Any]:
        """POST /v1/token: the agent takes ``new_token`` and accepts the old one
        for ``grace_seconds`` more."""
        return self._call(
            "POST",
            "/v1/token",
            json={"token": new_token, "grace_seconds": grace_seconds},
            what="taking a new token",
            shape=answers.rotated,
            secrets=(new_token,),
        )

    def log(self, replica_id: str, *, lines: int = 200, attempt: int | None = None) -> dict[str, Any]:
        """GET /v1/replicas/{id}/log: the last ``lines`` lines of its engine's log, secrets redacted;
        of a kept earlier start attempt's with ``attempt``."""
        params = {"lines": str(lines), **({"attempt": str(attempt)} if attempt is not None else {})}
        return self._call(
            "GET",
            self._path(replica_id) + "/log",
            params=params,
            what=f"reading replica {replica_id}'s log",
            shape=answers.log_tail,
        )

    def attempts(self, replica_id: str) -> dict[str, Any]:
        """GET /v1/replicas/{id}/attempts: the start attempts whose logs the agent keeps."""
        return self._call(
            "GET",
            self._path(replica_id) + "/attempts",
            what=f"listing replica {replica_id}'s start attempts",
            shape=answers.attempt_list,
        )

    def telemetry(self) -> dict[str, Any]:
        """GET /v1/telemetry: each card's memory, utilisation, temperature and processes."""
        return self._call(
            "GET", "/v1/telemetry", what="reading its cards' telemetry", shape=answers.telemetry
        )

    def replicas(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/replicas", what="listing its replicas", shape=answers.replica_list)

    def start(self, replica_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        """PUT the spec: 201 started, 200 already live with the same spec (harmless)."""
        return self._call(
            "PUT",
            self._path(replica_id),
            json=spec,
            what=f"starting replica {replica_id}",
            shape=answers.replica_state,
        )

    def get(self, replica_id: str, *, wait: float = 0.0, unless: str | None = None) -> dict[str, Any]:
        """The replica's state; with ``unless`` (the state last seen) and ``wait`` seconds, a long
        poll: the agent answers once the state is another, or after ``wait`` (docs/agent-api.md).
        The request's timeout is the agent's plus the wait."""
        what = f"reading the state of replica {replica_id}"
        if unless is None or wait <= 0:
            return self._call("GET", self._path(replica_id), what=what, shape=answers.replica_state)
        return self._call(
            "GET",
            self._path(replica_id),
            params={"wait": f"{wait:.3f}", "state": unless},
            what=what,
            timeout=self.timeout + wait,
            shape=answers.replica_state,
        )

    def stop(
        self, replica_id: str, *, grace: float | None = None, drain: float | None = None
    ) -> dict[str, Any]:
        """DELETE: answers once the process is gone. A ready engine is drained first: the agent
        waits up to ``drain`` seconds (LLMGW_STOP_DRAIN_SECONDS) for its requests in flight. A
        replica the agent does not know is as stopped as it gets: answered as such, not as an error."""
        drain = settings.LLMGW_STOP_DRAIN_SECONDS if drain is None else drain
        params = {"drain": f"{drain:g}"} if grace is None else {"grace": f"{grace:g}", "drain": f"{drain:g}"}
        # LLMGW_AGENT_STOP_SECONDS bounds the agent's own grace; a grace asked for gets its margin;
        # the drain comes before either.
        wait = drain + (settings.LLMGW_AGENT_STOP_SECONDS if grace is None else grace + STOP_MARGIN_SECONDS)
        try:
            return self._call(
                "DELETE",
                self._path(replica_id),
                params=params,
                what=f"stopping replica {replica_id}",
                timeout=max(self.timeout, wait),
                shape=answers.replica_state,
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
        shape: Callable[..., Any],
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
        secrets: tuple[str, ...] = (),
    ) -> Any:
        """The answer, read by ``shape`` into the API's fields; AgentCallFailed otherwise."""
        secrets = (self.token, *self.secrets, *secrets)
        response = self._send(
            method, path, what=what, json=json, params=params, timeout=timeout, secrets=secrets
        )
        who = f"The agent of node {self.node} ({self.url})"
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        status = response.status_code
        if status >= 400:
            raise _refusal(who, what, status, body, secrets)
        if body is None:
            raise AgentCallFailed(
                "agent_bad_answer",
                f"{who} answered {what} with something that is not JSON "
                f"(HTTP {status}): is that URL really a node agent?",
                status=status,
            )
        try:
            return shape(body, secrets=secrets)
        except answers.NotTheAPI as missing:
            raise AgentCallFailed(
                "agent_bad_answer",
                f"{who} answered {what} without the agent API's {missing} (HTTP {status}): is that URL "
                "really a node agent of this version (docs/agent-api.md)?",
                status=status,
            ) from None

    def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        json: Any,
        params: dict[str, str] | None,
        timeout: float | None,
        secrets: tuple[str, ...],
    ) -> transport.Answer:
        """The agent's response, from the address its URL was checked to resolve to."""
        timeout = self.timeout if timeout is None else timeout
        who = f"The agent of node {self.node} ({self.url})"
        if not (self.token.isascii() and self.token.isprintable()) or " " in self.token:
            # A row written before tokens were checked (catalog.models.fleet.agent_token_validator):
            # it cannot go in a header, and is not sent.
            raise AgentCallFailed(
                "agent_token",
                f"{who} was not called while {what}: the node's agent token in the catalog is not "
                "printable ASCII without spaces; set the node's token again (the admin, PATCH "
                f"/api/nodes/{self.node}/ with agent_token) to the one its agent expects.",
            )
        try:
            # Resolved and checked once: the connection goes to this address, not to a second lookup's.
            target = checked_address(self.url)
        except DomainError as exc:
            raise AgentCallFailed(
                "agent_address", f"{who} was not called while {what}: {exc.message}"
            ) from None
        if (plain := plaintext_refusal(self.url, target)) is not None:
            raise AgentCallFailed("agent_address", f"{who} was not called while {what}: {plain}.")
        connect = min(timeout, 5.0)
        try:
            return transport.request(
                target,
                method,
                self.url + path,
                headers={"Authorization": f"Bearer {self.token}"},
                json=json,
                params=params,
                timeout=timeout,
                connect=connect,
            )
        except transport.Unreachable as exc:
            raise _unreached(exc, who, what, timeout=timeout, connect=connect, secrets=secrets) from None


def _unreached(
    exc: transport.Unreachable,
    who: str,
    what: str,
    *,
    timeout: float,
    connect: float,
    secrets: tuple[str, ...],
) -> AgentCallFailed:
    """A call that got no answer, in the project's words."""
    if exc.stage == "connect":
        if exc.timed_out:
            return AgentCallFailed(
                "agent_down", f"{who} could not be reached within {connect:g} s while {what}: is the node up?"
            )
        if exc.untrusted:
            return AgentCallFailed(
                "agent_untrusted",
                f"{who} presented a certificate that is not trusted while {what}: set "
                "LLMGW_AGENT_CA_BUNDLE to the CA bundle that signed the agents' certificates.",
            )
        return AgentCallFailed(
            "agent_down",
            f"{who} refused the connection while {what}: is the agent running?"
            if exc.refused
            else f"{who} could not be reached while {what}: {_said(exc, secrets)}.",
        )
    if exc.timed_out:
        return AgentCallFailed("agent_slow", f"{who} did not answer within {timeout:g} s while {what}.")
    return AgentCallFailed(
        "agent_down", f"{who} broke off the connection while {what}: {_said(exc, secrets)}."
    )


def _said(exc: Exception, secrets: Iterable[str]) -> str:
    """A transport error's own text (the network's words, not the agent's), cleaned and redacted."""
    return answers.text(str(exc), 200, secrets=secrets) or type(exc).__name__


def _refusal(who: str, what: str, status: int, body: Any, secrets: tuple[str, ...]) -> AgentCallFailed:
    """An answer of ``status`` 400 or more, in the project's words: the agent's sentence only when
    the body has the API's error shape with one of its codes, cleaned and redacted."""
    code, detail = answers.error(body, secrets=secrets)
    if status == 401:
        return AgentCallFailed(
            "agent_token",
            f"{who} refused the token while {what}: the node's agent token in the "
            "catalog is not the one the agent expects.",
            status=401,
            agent_code=code,
        )
    if status == 404 and code == "not_found":
        return AgentCallFailed(
            "not_found", f"{who} does not know it ({what}): {detail}", status=404, agent_code=code
        )
    said = detail or "no explanation in the agent API's error shape"
    if status >= 500:
        return AgentCallFailed(
            "agent_failed",
            f"{who} failed while {what} (HTTP {status}): {said}",
            status=status,
            agent_code=code,
        )
    return AgentCallFailed(
        "agent_refused",
        f"{who} refused {what} (HTTP {status}{', ' + code if code else ''}): {said}",
        status=status,
        agent_code=code,
    )


def describe_failure(state: dict[str, Any], *, lines: int = 8, secrets: Iterable[str] = ()) -> str:
    """A failed replica in a sentence: the agent's reason, exit code, last log lines (its texts
    cleaned by ``answers``; ``secrets`` redacted again)."""
    parts = [str(state.get("reason") or "failed")]
    code = state.get("exit_code")
    if code is not None and "exit code" not in parts[0] and "killed by" not in parts[0]:
        parts.append(f"exit code {code}")
    tail = [str(line) for line in state.get("log_tail") or [] if str(line).strip()][-lines:]
    text = "; ".join(parts)
    if tail:
        text += ". Last lines of its log:\n" + "\n".join(tail)
    return redact(text, secrets)
