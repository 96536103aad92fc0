"""An agent URL reaches inside the fleet only: its host is resolved, each address it resolves to
(an IPv6 one carrying an IPv4 address unwrapped) must lie in a network LLMGW_AGENT_NETWORKS names,
and the call connects to the address that was checked, never to a second lookup's.

Names are resolved through ``socket.getaddrinfo``, the boundary the tests replace to make a name
resolve where they need (no /etc/hosts); the one real server is on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from agentclient.client import AgentCallFailed, AgentClient
from audit.models import AuditEntry
from catalog.models import Node
from tests.support import builders as b

pytestmark = pytest.mark.django_db

TOKEN = "agent-token-of-the-networks-test-0123456789"
DEFAULT = ["private"]  # the setting's default: the private ranges, no loopback


def _resolving(monkeypatch: pytest.MonkeyPatch, names: dict[str, list[str]]) -> list[str]:
    """``getaddrinfo`` answering ``names`` (each a list of addresses); the names asked, in order."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def fake(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host in names:
            asked.append(host)
            out = []
            for address in names[host]:
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                sockaddr = (
                    (address, int(port or 0), 0, 0)
                    if family == socket.AF_INET6
                    else (address, int(port or 0))
                )
                out.append((family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
            return out
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return asked


def _create(url: str, name: str = "gpu-new") -> Any:
    client = APIClient()
    editor = get_user_model().objects.filter(username="editor").first()
    client.force_authenticate(editor or b.user("editor", roles=("editor",)))
    return client.post("/api/nodes/", {"name": name, "agent_url": url, "agent_token": TOKEN}, format="json")


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://127.0.0.1:9101", "127.0.0.1"),
        ("http://127.0.0.1:5432", "127.0.0.1"),  # the database, on the control plane's own host
        ("http://[::1]:9101", "::1"),
        ("http://[::ffff:127.0.0.1]:9101", "127.0.0.1"),
        ("http://[::ffff:a9fe:a9fe]/", "169.254.169.254"),
        ("http://[64:ff9b::a9fe:a9fe]/", "169.254.169.254"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254"),
        ("http://[fd00:ec2::254]/", "fd00:ec2::254"),  # metadata, inside fc00::/7
        ("http://169.254.10.10:9101", "169.254.10.10"),
        ("http://8.8.8.8:9101", "8.8.8.8"),
        ("http://localhost:9101", "127.0.0.1"),
        ("http://agent.fleet.test:9101", "169.254.7.7"),  # a name resolving to link-local
        ("http://mixed.fleet.test:9101", "127.0.0.1"),  # one good address and one loopback
    ],
)
def test_an_agent_url_outside_the_networks_is_refused_naming_the_address_and_the_setting(
    url, address, settings, monkeypatch
):
    settings.LLMGW_AGENT_NETWORKS = DEFAULT
    _resolving(
        monkeypatch,
        {
            "localhost": ["127.0.0.1"],
            "agent.fleet.test": ["169.254.7.7"],
            "mixed.fleet.test": ["10.0.0.5", "127.0.0.1"],
        },
    )
    before = (Node.objects.count(), AuditEntry.objects.count())
    response = _create(url)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "refused_agent_url"
    assert address in body["detail"] and "LLMGW_AGENT_NETWORKS" in body["detail"], body["detail"]
    assert (Node.objects.count(), AuditEntry.objects.count()) == before


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3:9101",
        "http://[fd12::5]:9101",
        "http://gpu-7.fleet.test:9101",
        "https://[::ffff:10.0.0.9]/",
    ],
)
def test_an_agent_url_inside_the_private_ranges_is_taken(url, settings, monkeypatch):
    settings.LLMGW_AGENT_NETWORKS = DEFAULT
    _resolving(monkeypatch, {"gpu-7.fleet.test": ["10.20.30.40"]})
    response = _create(url)
    assert response.status_code == 201, response.content


def test_loopback_is_taken_once_the_setting_names_it_and_metadata_only_when_named_alone(settings):
    settings.LLMGW_AGENT_NETWORKS = ["private", "127.0.0.0/8", "169.254.0.0/16"]
    assert _create("http://[::ffff:127.0.0.1]:9101").status_code == 201
    refused = _create("http://169.254.169.254/", "gpu-2")
    assert refused.status_code == 400 and "169.254.169.254/32" in refused.json()["detail"]
    settings.LLMGW_AGENT_NETWORKS = ["private", "169.254.169.254/32"]
    assert _create("http://169.254.169.254/", "gpu-2").status_code == 201


def test_a_wrong_network_in_the_setting_stops_the_process_naming_it():
    from catalog.agent_address import parse_networks

    with pytest.raises(ValueError, match="'10.0.0/33' is not a network"):
        parse_networks(["private", "10.0.0/33"])


# -- the call: to the address checked, never one recorded straight into the database -------------------


class _Agent(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).seen.append({"path": self.path, "host": self.headers.get("Host", "")})
        body = json.dumps(
            {"node": "gpu-x", "cards": [], "agent_version": "0.1.0", "policy": "sha256:x"}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _agent_at(address: str) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """A server answering as an agent on ``address`` (a loopback one): its port, and what it was asked."""
    seen: list[dict[str, str]] = []
    server = http.server.ThreadingHTTPServer((address, 0), type("Agent", (_Agent,), {"seen": seen}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def loopback_agent() -> Iterator[tuple[int, list[dict[str, str]]]]:
    with _agent_at("127.0.0.1") as found:
        yield found


def test_a_node_recorded_with_a_loopback_url_is_not_called_and_its_log_page_says_why(
    settings, loopback_agent
):
    port, seen = loopback_agent
    node = b.node("gpu-x", agent_url=f"http://127.0.0.1:{port}", agent_token=TOKEN)
    b.replica(b.profile(b.llama_8b("llama")), node, [0], name="llama-1")
    settings.LLMGW_AGENT_NETWORKS = DEFAULT
    with pytest.raises(AgentCallFailed) as caught:
        AgentClient.for_node(node).node_info()
    assert caught.value.code == "agent_address"
    assert "127.0.0.1" in caught.value.message and "LLMGW_AGENT_NETWORKS" in caught.value.message
    client = Client()
    client.force_login(b.user("viewer"))
    page = client.get("/replicas/llama-1/log/").content.decode()
    assert "LLMGW_AGENT_NETWORKS" in page
    assert seen == []  # nothing reached the server


def test_the_call_goes_to_the_address_checked_with_the_agent_urls_host_and_no_second_lookup(
    settings, monkeypatch, loopback_agent
):
    """A name that resolves to an allowed address when checked and to the metadata service the next
    time (DNS rebinding) is looked up once: the request reaches the address checked, saying the
    URL's host."""
    port, seen = loopback_agent
    settings.LLMGW_AGENT_NETWORKS = ["127.0.0.0/8"]
    answers = iter([["127.0.0.1"]])
    real = socket.getaddrinfo
    asked: list[str] = []

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "agent.fleet.test":
            asked.append(host)
            address = next(answers, ["169.254.169.254"])[0]
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, args[0]))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    node = Node(name="gpu-x", agent_url=f"http://agent.fleet.test:{port}", agent_token=TOKEN)
    assert AgentClient.for_node(node).node_info()["node"] == "gpu-x"
    assert asked == ["agent.fleet.test"]
    assert seen == [{"path": "/v1/node", "host": f"agent.fleet.test:{port}"}]


def test_a_name_that_resolves_elsewhere_after_it_was_saved_is_checked_again_at_each_call(
    settings, monkeypatch
):
    """Saved while it resolved inside the networks, the name later resolves outside them (to another
    loopback address, where a server of the test's own listens): the call is refused, and nothing
    reaches that server."""
    with _agent_at("127.0.0.2") as (port, seen):
        settings.LLMGW_AGENT_NETWORKS = ["127.0.0.1/32"]
        answers = iter(["127.0.0.1"])
        real = socket.getaddrinfo

        def moving(host: Any, *args: Any, **kwargs: Any) -> Any:
            if host == "agent.fleet.test":
                address = next(answers, "127.0.0.2")
                return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, args[0]))]
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", moving)
        assert _create(f"http://agent.fleet.test:{port}").status_code == 201
        node = Node.objects.get(name="gpu-new")
        with pytest.raises(AgentCallFailed) as caught:
            AgentClient.for_node(node).node_info()
        assert caught.value.code == "agent_address" and "127.0.0.2" in caught.value.message
        assert seen == []


def test_plain_http_is_called_only_inside_the_networks_that_allow_it_and_https_everywhere(settings):
    """The agent token goes in every request: over plain http only to an address inside
    LLMGW_AGENT_PLAIN_HTTP_NETWORKS (loopback by default). Outside it the call is refused before any
    connection, saying why and how to allow it; once the network is named, the same call goes through.
    (The server is on 127.0.0.2; the setting is narrowed to 127.0.0.1 to stand for a fleet network.)"""
    from catalog.agent_address import plaintext_refusal, validate_agent_url

    with _agent_at("127.0.0.2") as (port, seen):
        settings.LLMGW_AGENT_NETWORKS = ["127.0.0.0/8"]
        settings.LLMGW_AGENT_PLAIN_HTTP_NETWORKS = ["127.0.0.1/32"]
        node = Node(name="gpu-x", agent_url=f"http://127.0.0.2:{port}", agent_token=TOKEN)
        with pytest.raises(AgentCallFailed) as caught:
            AgentClient.for_node(node).node_info()
        message = caught.value.message
        assert caught.value.code == "agent_address"
        assert "plain http to 127.0.0.2" in message and "in clear" in message
        assert "https://" in message and "LLMGW_AGENT_PLAIN_HTTP_NETWORKS" in message
        assert seen == []  # refused before any connection
        settings.LLMGW_AGENT_PLAIN_HTTP_NETWORKS = ["127.0.0.0/8"]
        assert AgentClient.for_node(node).node_info()["node"] == "gpu-x"
        assert len(seen) == 1
    # https carries the token inside TLS: never refused for it (checked without a connection: the
    # address is text only).
    settings.LLMGW_AGENT_NETWORKS = ["private"]
    settings.LLMGW_AGENT_PLAIN_HTTP_NETWORKS = ["127.0.0.0/8", "::1/128"]
    assert plaintext_refusal("https://10.1.2.3:9101", validate_agent_url("https://10.1.2.3:9101")) is None
    assert "10.1.2.3" in (
        plaintext_refusal("http://10.1.2.3:9101", validate_agent_url("http://10.1.2.3:9101")) or ""
    )
