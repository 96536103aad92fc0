"""How the control plane reaches an agent: TLS against LLMGW_AGENT_CA_BUNDLE, and every connection
pinned to the address ``catalog.agent_address`` checked (no second lookup between the check and
the connection; docs/design.md, "The catalog").

One request a connection, through the standard library's ``http.client``: the socket is opened to
the checked address alone, while the Host header and the TLS server name (SNI and the
certificate's check) stay the agent URL's host. It replaced httpx here for its cost: a telemetry
round calls every node's agent, and httpx took 1.2 ms of CPU a call against 0.55 ms for the same
GET through ``http.client`` (docs/benchmarks.md, the telemetry round). No proxy from the
environment is ever used, no redirect is followed, and the timeouts are httpx's: ``connect``
seconds for the TCP connection and the TLS handshake, ``timeout`` seconds for each read or write
after it.
"""

from __future__ import annotations

import functools
import http.client
import json as jsonlib
import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
from django.conf import settings

from catalog.agent_address import AgentAddress


class Unreachable(Exception):
    """The call got no answer. ``stage``: ``connect`` (the TCP connection or the TLS handshake)
    or ``exchange`` (sending the request, reading the answer); ``timed_out``, ``refused`` and
    ``untrusted`` (the certificate was not trusted) say why where it is one of those."""

    def __init__(
        self,
        stage: str,
        text: str,
        *,
        timed_out: bool = False,
        refused: bool = False,
        untrusted: bool = False,
    ):
        super().__init__(text)
        self.stage = stage
        self.timed_out = timed_out
        self.refused = refused
        self.untrusted = untrusted


@dataclass(frozen=True)
class Answer:
    """An agent's HTTP answer: its status and its body as it came."""

    status_code: int
    content: bytes

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not."""
        return jsonlib.loads(self.content)


class _PinnedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection to ``target.address`` whatever host the URL names; the URL's host is
    what the Host header and the TLS server name say."""

    def __init__(
        self, target: AgentAddress, *, tls: ssl.SSLContext | None, connect: float, timeout: float
    ) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self.default_port = 443 if tls is not None else 80  # the Host header leaves it out, as httpx did
        self.target = target
        self.tls = tls
        self.connect_timeout = connect

    def connect(self) -> None:
        stage = "connect"
        try:
            sock = socket.create_connection(
                (str(self.target.address), self.target.port), self.connect_timeout
            )
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.tls is not None:
                    sock = self.tls.wrap_socket(sock, server_hostname=self.target.host)
            except BaseException:
                sock.close()
                raise
            sock.settimeout(self.timeout)
        except ssl.SSLCertVerificationError as exc:
            raise Unreachable(stage, str(exc), untrusted=True) from None
        except TimeoutError as exc:
            raise Unreachable(stage, str(exc) or "timed out", timed_out=True) from None
        except ConnectionRefusedError as exc:
            raise Unreachable(stage, str(exc), refused=True) from None
        except OSError as exc:
            raise Unreachable(stage, str(exc) or type(exc).__name__) from None
        self.sock = sock


def request(
    target: AgentAddress,
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    json: Any = None,
    params: dict[str, str] | None = None,
    timeout: float,
    connect: float,
) -> Answer:
    """``method`` ``url`` sent to ``target`` (the address ``url``'s host was checked to resolve to),
    its answer read whole; Unreachable when there is none. ``json``: the body, as httpx wrote it
    (compact, UTF-8, no NaN: ValueError for one)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or (parts.hostname or "").lower() != target.host:
        # Never the case through AgentClient (the target is checked_address(url)): said, not sent.
        raise Unreachable("connect", f"{url} is not an http(s) URL of the host whose address was checked")
    tls = tls_context() if parts.scheme == "https" else None
    target_path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if params:
        target_path += ("&" if parts.query else "?") + urlencode(params)
    body = None
    sent = dict(headers)
    if json is not None:
        body = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        sent["Content-Type"] = "application/json"
    connection = _PinnedConnection(target, tls=tls, connect=connect, timeout=timeout)
    try:
        connection.request(method, target_path, body=body, headers=sent)
        response = connection.getresponse()
        return Answer(status_code=response.status, content=response.read())
    except TimeoutError as exc:
        raise Unreachable("exchange", str(exc) or "timed out", timed_out=True) from None
    except (OSError, http.client.HTTPException) as exc:
        raise Unreachable("exchange", str(exc) or type(exc).__name__) from None
    finally:
        connection.close()


def tls_context() -> ssl.SSLContext:
    """The TLS context agent calls use: made once per CA bundle (as the file is), not per call
    (reading the whole CA store is some 18 ms of CPU)."""
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
    # Without a bundle, httpx's own default (certifi's store), as the calls through httpx had.
    return ssl.create_default_context(cafile=bundle) if bundle else httpx.create_ssl_context(trust_env=False)
