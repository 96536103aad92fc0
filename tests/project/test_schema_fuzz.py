"""schemathesis against the served OpenAPI schema, signed in with an API token: every operation,
a bounded number of examples each, failing on any 5xx or any response the schema does not describe."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from llmgw_web.wsgi import application
from tests.support import builders as b

pytestmark = pytest.mark.django_db


@pytest.fixture
def api_schema(db, settings):
    settings.ALLOWED_HOSTS = ["localhost", "testserver"]
    b.node("gpu-1")
    b.profile(b.llama_8b("llama"), "h100")
    secret = b.token(b.user("fuzzer", roles=("admin",)))
    schema = schemathesis.openapi.from_wsgi(
        "/api/schema/?format=json", application, headers={"Authorization": f"Token {secret}"}
    )
    schema.config.headers = {"Authorization": f"Token {secret}"}
    return schema


@pytest.fixture(autouse=True)
def one_connection():
    """The app is called through WSGI, in this test's transaction: as Django's test client does, it
    must not close the connection at the end of each request."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


EXAMPLES = 5  # each operation's; the whole run stays well under a minute
# No 5xx, whatever comes in, and every answer as the schema says: its status code documented, its
# content type and its body those the schema gives for that code.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_the_api_answers_as_its_schema_says(api_schema):
    failures = []
    refused_only = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        statuses: set[int] = set()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def answers(case: Any) -> None:
            statuses.add(case.call_and_validate(checks=CHECKS).status_code)  # noqa: B023 (run at once)

        try:
            answers()
        except Exception as exc:  # each operation's first failure, all reported at the end
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:600]}")
        if statuses <= {401, 403}:
            refused_only.append(f"{operation.method.upper()} {operation.path}")
    assert failures == [], "\n\n".join(failures)
    # Signed in as an admin, every operation got past the gate at least once: the run tested them.
    assert refused_only == []


def test_the_schema_documents_write_bodies_nullable_replicas_and_the_errors():
    from drf_spectacular.generators import SchemaGenerator

    doc = SchemaGenerator().get_schema(request=None, public=True)
    for path, method, status in [
        ("/api/models/", "post", "201"),
        ("/api/models/{name}/", "put", "200"),
        ("/api/nodes/{name}/", "patch", "200"),
    ]:
        responses = doc["paths"][path][method]["responses"]
        assert "application/json" in responses[status].get("content", {}), (path, method)
        assert {"400", "401", "403", "404"} <= set(responses), (path, method)
    step = doc["components"]["schemas"]["RestartStep"]["properties"]
    assert step["old_replica"]["nullable"] and step["new_replica"]["nullable"]
