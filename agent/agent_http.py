"""The tests' HTTP client of an agent, standard library only: one request, its answer, and a client
that keeps the agent's address and token."""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class TransportError(OSError):
    """Nothing answered: refused, reset, timed out."""


@dataclass
class Answer:
    """An HTTP answer: its status, headers and body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}: {self.text[:500]}")


def request(
    method: str,
    url: str,
    *,
    json_body: Any = None,
    params: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    verify: ssl.SSLContext | None = None,
) -> Answer:
    """One request, straight to the host (never through a proxy from the
    environment); an answer whatever its status, TransportError when nothing answers.

    ``verify`` is the TLS context an https URL is checked with (default: the system's CAs)."""
    parts = urllib.parse.urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if params:
        target += ("&" if parts.query else "?") + urllib.parse.urlencode(params)
    host, port = parts.hostname or "127.0.0.1", parts.port
    connection = (
        http.client.HTTPSConnection(host, port, timeout=timeout, context=verify)
        if parts.scheme == "https"
        else http.client.HTTPConnection(host, port, timeout=timeout)
    )
    data = None if json_body is None else json.dumps(json_body).encode()
    sent = dict(headers or {})
    if data is not None:
        sent["Content-Type"] = "application/json"
    try:
        # A server may answer before reading the whole body (413: too large) and
        # close; its answer is there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.request(method, target, body=data, headers=sent)
        response = connection.getresponse()
        return Answer(response.status, dict(response.headers), response.read())
    except (OSError, http.client.HTTPException) as exc:
        raise TransportError(f"{method} {url}: {exc}") from exc
    finally:
        connection.close()


class Client:
    """Requests to one base URL with fixed headers (a token), in the shape the tests use."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        verify: ssl.SSLContext | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.verify = verify
        self.default_headers = dict(headers or {})
        self.timeout = timeout

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing is kept open between requests: each has its own connection."""

    def request(self, method: str, path: str, **kw: Any) -> Answer:
        headers = {**self.default_headers, **(kw.pop("headers", None) or {})}
        return request(
            method,
            f"{self.base_url}{path}",
            json_body=kw.pop("json", None),
            params=kw.pop("params", None),
            headers=headers,
            timeout=kw.pop("timeout", self.timeout),
            verify=self.verify,
        )

    def get(self, path: str, **kw: Any) -> Answer:
        return self.request("GET", path, **kw)

    def put(self, path: str, **kw: Any) -> Answer:
        return self.request("PUT", path, **kw)

    def post(self, path: str, **kw: Any) -> Answer:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> Answer:
        return self.request("DELETE", path, **kw)
