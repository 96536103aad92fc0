"""How the control plane reaches an agent: TLS against LLMGW_AGENT_CA_BUNDLE, and every connection
pinned to the address ``catalog.agent_address`` checked (no second lookup between the check and
the connection; docs/design.md, "The catalog")."""

from __future__ import annotations

import functools
import os
import ssl
from typing import Any

import httpcore
import httpx
from django.conf import settings

from catalog.agent_address import AgentAddress


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


def tls_context() -> ssl.SSLContext:
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
