"""The agent over https with a CA bundle to trust, and token rotation without
downtime: the agent accepts both tokens for the grace period, and the catalog
writes the new one only once the agent has answered with it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from agent_testing import free_port, running_agent, standin_spec, wait_until

from agentclient.client import AgentCallFailed, AgentClient
from audit.models import AuditEntry
from base.actor import Actor, acting_as
from base.errors import DomainError
from catalog.models import Node
from operations.services.agent_token import node_rotate_token

pytestmark = pytest.mark.django_db


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> dict[str, Path]:
    """A CA, and a certificate for 127.0.0.1 it signed (openssl, EC keys: fast); and one for the name
    agent-tls.fleet.test alone."""
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=llmgw test CA",
        cwd=d,
    )
    _openssl("req", *ec, "-keyout", "agent.key", "-out", "agent.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "x509", "-req", "-in", "agent.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "agent.crt", "-days", "2", "-extfile", "san.cnf",
        cwd=d,
    )  # fmt: skip
    (d / "agent.key").chmod(0o600)
    (d / "name.cnf").write_text("subjectAltName=DNS:agent-tls.fleet.test\n")
    _openssl(
        "x509", "-req", "-in", "agent.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "named.crt", "-days", "2", "-extfile", "name.cnf",
        cwd=d,
    )  # fmt: skip
    return {"ca": d / "ca.crt", "cert": d / "agent.crt", "key": d / "agent.key", "named": d / "named.crt"}


@pytest.fixture
def tls_agent(tmp_path, certificates):
    extra = {"tls_cert_file": str(certificates["cert"]), "tls_key_file": str(certificates["key"])}
    with running_agent(tmp_path / "agent", extra=extra, ca_bundle=str(certificates["ca"])) as agent:
        yield agent


def _node(agent, name: str = "gpu-tls") -> Node:
    return Node.objects.create(name=name, agent_url=agent.base_url, agent_token=agent.token, state="ready")


def test_the_agent_serves_https_and_the_control_plane_trusts_the_ca_bundle(tls_agent, certificates, settings):
    assert tls_agent.base_url.startswith("https://")
    node = _node(tls_agent)

    settings.LLMGW_AGENT_CA_BUNDLE = str(certificates["ca"])
    info = AgentClient.for_node(node).node_info()
    assert info["node"] == "gpu-test"

    settings.LLMGW_AGENT_CA_BUNDLE = ""
    with pytest.raises(AgentCallFailed) as caught:
        AgentClient.for_node(node).node_info()
    assert caught.value.code == "agent_untrusted"
    assert "LLMGW_AGENT_CA_BUNDLE" in caught.value.message
    # Plain http to a TLS agent does not reach it either.
    with pytest.raises(httpx.HTTPError):
        httpx.get(tls_agent.base_url.replace("https", "http") + "/healthz", timeout=3, trust_env=False)


def test_an_https_agent_named_by_a_name_is_called_at_the_address_checked_under_its_own_server_name(
    certificates, settings, monkeypatch
):
    """The connection is pinned to the address the check resolved, and the TLS server name stays the
    URL's: the server's certificate names agent-tls.fleet.test alone, which a call naming the bare
    address refuses. (A server of the test's own on 127.0.0.1, serving that certificate.)"""
    import http.server
    import json
    import socket
    import ssl
    import threading

    class Agent(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps({"node": "gpu-tls", "cards": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Agent)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificates["named"], certificates["key"])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    settings.LLMGW_AGENT_CA_BUNDLE = str(certificates["ca"])
    real = socket.getaddrinfo
    asked = []

    def resolve(host, port, *args, **kwargs):
        if host == "agent-tls.fleet.test":
            asked.append(host)
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    try:
        named = Node(name="gpu-tls", agent_url=f"https://agent-tls.fleet.test:{port}", agent_token="t" * 32)
        assert AgentClient.for_node(named).node_info()["node"] == "gpu-tls"
        assert asked == ["agent-tls.fleet.test"]
        bare = Node(name="gpu-tls", agent_url=f"https://127.0.0.1:{port}", agent_token="t" * 32)
        with pytest.raises(AgentCallFailed) as caught:
            AgentClient.for_node(bare).node_info()
        assert caught.value.code == "agent_untrusted"
    finally:
        server.shutdown()
        server.server_close()


def test_a_token_is_rotated_without_downtime_and_saved_only_once_confirmed(tls_agent, certificates, settings):
    settings.LLMGW_AGENT_CA_BUNDLE = str(certificates["ca"])
    node = _node(tls_agent)
    old = node.agent_token
    with tls_agent.client() as http:
        assert http.put("/v1/replicas/r1", json=standin_spec(port=free_port())).status_code == 201
    tls_agent.wait_for_state("r1", "ready")

    with acting_as(Actor(via="cli", name="ops")):
        node_rotate_token(instance=node, grace_seconds=2)

    node.refresh_from_db()
    new = node.agent_token
    assert new != old
    assert (tls_agent.directory / "token").read_text().strip() == new  # survives an agent restart
    with tls_agent.client(token=new) as http:
        assert http.get("/v1/replicas/r1").json()["state"] == "ready"  # still serving
    with tls_agent.client(token=old) as http:
        assert http.get("/v1/node").status_code == 200  # the grace period
        wait_until(
            lambda: http.get("/v1/node").status_code == 401, timeout=10, what="the old token to expire"
        )
    (entry,) = AuditEntry.objects.filter(action="rotate_token")
    assert entry.before["agent_token"] != entry.after["agent_token"]
    assert old not in str(entry.before) + str(entry.after) and new not in str(entry.after)


def test_a_token_the_agent_does_not_confirm_is_not_saved(tmp_path, settings):
    # The token comes from the agent's environment: it cannot write a new one where it would last.
    with running_agent(tmp_path / "agent", token_in_env=True) as agent:
        node = _node(agent, "gpu-env")
        audit = AuditEntry.objects.count()
        with pytest.raises(DomainError) as caught, acting_as(Actor(via="cli", name="ops")):
            node_rotate_token(instance=node, grace_seconds=5)
        assert "token_file" in caught.value.message
        node.refresh_from_db()
        assert node.agent_token == agent.token
        assert AuditEntry.objects.count() == audit
        with agent.client() as http:
            assert http.get("/v1/node").status_code == 200


def test_a_rotation_answers_only_to_a_valid_token(tls_agent):
    with tls_agent.client(token="wrong-token-0123456789") as http:
        assert http.post("/v1/token", json={"token": "n" * 32}).status_code == 401
    with tls_agent.client() as http:
        short = http.post("/v1/token", json={"token": "short"})
        assert (short.status_code, short.json()["code"]) == (400, "invalid_token")
        assert http.get("/v1/node").status_code == 200


def test_a_call_reaches_the_agent_as_its_url_names_it_with_the_token_and_a_compact_json_body(settings):
    """What the agent receives (a server of the test's own on 127.0.0.1, recording each request):
    the Host header the URL's, the node's token, the query encoded, a body as compact UTF-8 JSON with its length."""
    import http.server
    import json
    import threading

    seen: list[tuple[str, str, str | None, str | None, str | None, bytes]] = []

    class Agent(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = self.headers.get("Content-Length")
            body = self.rfile.read(int(length or 0))
            seen.append(
                (self.command, self.path, self.headers["Host"], self.headers["Authorization"], length, body)
            )
            out = json.dumps({"id": "r/1", "state": "ready"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_PUT = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        node = Node(name="gpu-seen", agent_url=f"http://127.0.0.1:{port}/", agent_token="s" * 32)
        client = AgentClient.for_node(node)
        assert client.get("r/1", wait=1.5, unless="loading")["state"] == "ready"
        client.start("r/1", {"model": "é", "card_indexes": [0]})
        with pytest.raises(AgentCallFailed):  # the answer is not a token's: refused as not the API's
            client.rotate_token("n" * 32, grace_seconds=5)
    finally:
        server.shutdown()
        server.server_close()
    host, token = f"127.0.0.1:{port}", "Bearer " + "s" * 32
    spec = '{"model":"é","card_indexes":[0]}'.encode()
    rotation = b'{"token":"' + b"n" * 32 + b'","grace_seconds":5}'
    assert seen == [
        ("GET", "/v1/replicas/r%2F1?wait=1.500&state=loading", host, token, None, b""),
        ("PUT", "/v1/replicas/r%2F1", host, token, str(len(spec)), spec),
        ("POST", "/v1/token", host, token, str(len(rotation)), rotation),
    ]
