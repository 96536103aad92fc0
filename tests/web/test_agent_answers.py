"""An agent's answer is never shown as it came: the replica log page of a node whose "agent" answers
arbitrary text (a server of the test's own on 127.0.0.1, which loopback the tests' settings allow)
shows none of it, whatever the status and whatever shape; only the fields the agent API defines
are shown, cleaned, and an error is the project's sentence, the agent's own only in the API's
error shape, redacted."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from agentclient.client import AgentCallFailed, AgentClient
from tests.support import builders as b

pytestmark = pytest.mark.django_db

TOKEN = "agent-token-of-the-answers-test-0123456789"
JUNK = "JUNK-7f3a<script>alert(1)</script>"

# (status, content type, body) the "agent" answers, each carrying the junk somewhere.
ANSWERS: dict[str, tuple[int, str, bytes]] = {
    "html": (200, "text/html", f"<html><body>{JUNK}</body></html>".encode()),
    "text 500": (500, "text/plain", f"Traceback: {JUNK}".encode()),
    "text 400": (400, "text/plain", JUNK.encode()),
    "text 404": (404, "text/plain", JUNK.encode()),
    "text 401": (401, "text/plain", JUNK.encode()),
    "json error, unknown code": (500, "application/json", json.dumps({"detail": JUNK, "code": "x"}).encode()),
    "json error, no code": (409, "application/json", json.dumps({"detail": JUNK}).encode()),
    "json not_found with junk": (404, "application/json", json.dumps({"error": JUNK}).encode()),
    "json list": (200, "application/json", json.dumps([JUNK]).encode()),
    "json lines not a list": (200, "application/json", json.dumps({"lines": JUNK}).encode()),
    "json lines of objects": (
        200,
        "application/json",
        json.dumps({"lines": [{"text": JUNK}], "state": JUNK, "id": JUNK, "html": JUNK}).encode(),
    ),
    "json without lines": (200, "application/json", json.dumps({"log": [JUNK], "state": "ready"}).encode()),
    "binary": (200, "application/octet-stream", b"\x00\xff" + JUNK.encode()),
}


class _Junk(http.server.BaseHTTPRequestHandler):
    answer: tuple[int, str, bytes] = ANSWERS["html"]

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        status, kind, body = type(self).answer
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def junk_agent() -> Iterator[tuple[int, type[_Junk]]]:
    handler = type("Junk", (_Junk,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def replica_on(junk_agent) -> Any:
    port, _ = junk_agent
    node = b.node("gpu-j", agent_url=f"http://127.0.0.1:{port}", agent_token=TOKEN)
    return b.replica(b.profile(b.llama_8b("llama")), node, [0], name="llama-1", state="loading")


@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_the_log_page_of_a_node_whose_agent_answers_junk_shows_none_of_it(kind, junk_agent, replica_on):
    _, handler = junk_agent
    handler.answer = ANSWERS[kind]
    client = Client()
    client.force_login(b.user("viewer"))
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = client.get("/replicas/llama-1/log/", **headers)
        assert response.status_code == 200
        page = response.content.decode()
        assert "JUNK-7f3a" not in page, page
        # The project's sentence naming the node instead, or no line (none was the API's).
        assert "gpu-j" in page or "Reading the log" in page, page


def test_an_agent_sentence_in_the_api_error_shape_is_kept_cleaned_and_redacted(junk_agent, replica_on):
    _, handler = junk_agent
    detail = f"Card 1 is held\x1b[31m by {TOKEN}\nsee\u202eevil"
    handler.answer = (409, "application/json", json.dumps({"detail": detail, "code": "card_busy"}).encode())
    node = replica_on.shards.get().card.node
    with pytest.raises(AgentCallFailed) as caught:
        AgentClient.for_node(node).log("llama-1")
    message = caught.value.message
    assert caught.value.agent_code == "card_busy"
    assert "Card 1 is held" in message and TOKEN not in message
    assert "\x1b" not in message and "\n" not in message and "\u202e" not in message


def test_the_fields_the_api_defines_are_kept_each_of_its_type(junk_agent, replica_on):
    _, handler = junk_agent
    state = {
        "id": "llama-1",
        "state": "failed",
        "exit_code": 3,
        "reason": f"exited \x07with {TOKEN}",
        "log_tail": ["ok", 7, {"x": JUNK}, "last"],
        "memory": {"weights": 10, "kv_cache": "lots", "<b>": 1},
        "html": JUNK,
    }
    handler.answer = (200, "application/json", json.dumps(state).encode())
    node = replica_on.shards.get().card.node
    answer = AgentClient.for_node(node).get("llama-1")
    assert "html" not in answer
    assert answer["log_tail"] == ["ok", "", "", "last"]
    assert answer["memory"] == {"weights": 10}
    assert answer["reason"] == "exited  with ***"


def test_the_profiles_secret_is_redacted_from_the_log_page_in_every_form_the_agent_sends_it(junk_agent):
    """The control plane redacts again whatever the agent did: the key as it is, base64'd in a
    header, upper-cased, and wrapped over two lines with their prefixes."""
    import base64

    key = "vllm-key-of-the-answers-test-0123456789"
    port, handler = junk_agent
    node = b.node("gpu-k", agent_url=f"http://127.0.0.1:{port}", agent_token=TOKEN)
    profile = b.profile(b.llama_8b("llama"), env={"VLLM_API_KEY": key})
    b.replica(profile, node, [0], name="llama-1", state="ready")
    header = base64.b64encode(f"Authorization: Bearer {key}".encode()).decode()
    lines = [
        f"engine[1]: api key {key}",
        f"engine[1]: headers {header}",
        f"engine[1]: KEY {key.upper()}",
        f"engine[1]: wrapped {key[:12]}",
        f"engine[1]: {key[12:]} and on",
    ]
    handler.answer = (
        200,
        "application/json",
        json.dumps({"id": "llama-1", "state": "ready", "lines": lines}).encode(),
    )
    client = Client()
    client.force_login(b.user("viewer"))
    page = client.get("/replicas/llama-1/log/").content.decode()
    assert "engine[1]: api key ***" in page and "and on" in page
    for copy in (key, key.upper(), header, key[:12], key[12:]):
        assert copy not in page


def test_a_failure_the_agent_describes_is_redacted_before_it_becomes_a_steps_reason(junk_agent, replica_on):
    from agentclient.client import describe_failure

    key = "hf_failure-reason-token-0123456789"
    _, handler = junk_agent
    state = {
        "id": "llama-1",
        "state": "failed",
        "exit_code": 1,
        "reason": f"exited: bad token {key.upper()}",
        "log_tail": [f"engine: token {key[:20]}", f"engine: {key[20:]}", "engine: giving up"],
    }
    handler.answer = (200, "application/json", json.dumps(state).encode())
    node = replica_on.shards.get().card.node
    said = describe_failure(AgentClient.for_node(node, secrets=[key]).get("llama-1"))
    assert "giving up" in said and "bad token ***" in said
    assert key[:20] not in said and key[20:] not in said and key.upper() not in said
