"""schemathesis against the served OpenAPI schema, with every check it has, signed in with an API
token as an admin and as a viewer: requests valid by the schema (each must be accepted: no 400 for a
bound, a type or a field the schema allows) and requests invalid by it (each must be refused). Five
examples per operation and mode, the same each run, keep the run near half a minute; FUZZ_EXAMPLES=40
and FUZZ_RANDOM=1 search deeper.

The one thing the schema cannot say is a rule over the catalog's data or over several fields: a name
that must be another object's, the source and launch policies, a profile that must fit its cards.
Those refusals carry codes of their own (RULES, each the server's sentence says); a 400 under any
other code for a schema-valid request is a failure."""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks, positive_data_acceptance

from llmgw_web.wsgi import application
from tests.support import builders as b

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "5"))  # each operation's, in each mode
# The same examples on every run, so that CI judges the change and not the draw; FUZZ_RANDOM=1 draws
# anew each run, to search (with FUZZ_EXAMPLES) for what these do not reach.
DERANDOMIZE = not os.environ.get("FUZZ_RANDOM")

# Refusals by a rule the OpenAPI schema cannot state: the code, and where the rule is.
RULES = {
    "does_not_exist": "a model, profile or GPU class named in the body must be in the catalog",
    "unique": "a new object's name must not be another's",
    "usable_above_memory": "a GPU class's usable_mib at most its memory_mib (catalog/api/serializers.py)",
    "refused_source": "a model's source: a Hugging Face repo id or a path under LLMGW_MODEL_ROOTS",
    "refused_arg": "the launch policy's allowlist of engine arguments and environment (agent/llmgw_policy)",
    "memory": "a profile must fit its cards' memory (catalog/services/fit.py)",
    "heads": "tensor-parallel width must divide the model's heads (planning/rules.py)",
    "declared": "a model declared in the cluster's settings file is read-only",
    "dates_swapped": "the audit log's since no later than its until (audit/forms.py)",
    "refused_agent_url": "an agent URL's host must resolve into LLMGW_AGENT_NETWORKS (catalog/agent_address.py)",
    "state_by_operation": "a node's state changes by cordon, uncordon and drain only (catalog/services/catalog.py)",
}


def positive_data_acceptance_but_rules(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' positive_data_acceptance, but for a 400 refusing by one of RULES."""
    if response.status_code == 400:
        try:
            code = response.json().get("code")
        except ValueError:
            code = None
        if code in RULES:
            return None
    return positive_data_acceptance(ctx, response, case)


def every_check() -> list[Any]:
    load_all_checks()
    checks = [c for c in CHECKS.get_all() if c is not positive_data_acceptance]
    return [*checks, positive_data_acceptance_but_rules]


@pytest.fixture
def api_schema(db, settings):
    settings.ALLOWED_HOSTS = ["localhost", "testserver"]
    b.node("gpu-1")
    b.profile(b.llama_8b("llama"), "h100")

    def schema_for(role: str) -> Any:
        secret = b.token(b.user(f"fuzzer-{role}", roles=(role,)))
        schema = schemathesis.openapi.from_wsgi(
            "/api/schema/?format=json", application, headers={"Authorization": f"Token {secret}"}
        )
        schema.config.headers = {"Authorization": f"Token {secret}"}
        return schema

    return schema_for


@pytest.fixture(autouse=True)
def one_connection():
    """The app is called through WSGI, in this test's transaction: as Django's test client does, it
    must not close the connection at the end of each request."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def takes_input(operation: Any) -> bool:
    """Whether a request to ``operation`` can break its schema: a path parameter is any text."""
    raw = operation.definition.raw
    return "requestBody" in raw or any(p.get("in") == "query" for p in raw.get("parameters", []))


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
@pytest.mark.parametrize("role", ["admin", "viewer"])
def test_the_api_answers_as_its_schema_says(api_schema, role, mode):
    checks = every_check()
    failures = []
    refused_only = []
    for result in api_schema(role).get_all_operations():
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and not takes_input(operation):
            continue
        statuses: set[int] = set()

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=DERANDOMIZE,
        )
        def answers(case: Any) -> None:
            statuses.add(case.call_and_validate(checks=checks).status_code)  # noqa: B023 (run at once)

        try:
            answers()
        except Unsatisfiable:
            continue  # no request breaking the schema could be made (an enum with nothing outside it)
        except (Exception, BaseExceptionGroup) as exc:  # each operation's first failure, reported at the end
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:1200]}")
        if statuses <= {401, 403}:
            refused_only.append(f"{operation.method.upper()} {operation.path}")
    assert failures == [], "\n\n".join(failures)
    if role == "admin" and mode is GenerationMode.POSITIVE:
        # Signed in as an admin, every operation got past the gate at least once: the run tested them.
        assert refused_only == []


def test_the_schema_states_the_bounds_the_server_holds():
    from drf_spectacular.generators import SchemaGenerator

    doc = SchemaGenerator().get_schema(request=None, public=True)
    schemas, paths = doc["components"]["schemas"], doc["paths"]
    limit = next(p for p in paths["/api/nodes/"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"] == {"type": "integer", "minimum": 0, "maximum": 1000} and limit["allowEmptyValue"]
    assert schemas["ResizeInputRequest"]["additionalProperties"] is False
    gpus = schemas["ResizeInputRequest"]["properties"]["gpus"]
    assert (gpus["minimum"], gpus["maximum"]) == (1, 64)
    assert schemas["GPUClassRequest"]["properties"]["memory_mib"]["minimum"] == 1
    port = schemas["ReplicaRequest"]["properties"]["port"]
    assert (port["minimum"], port["maximum"]) == (1, 65535)
    assert "vllm" in schemas["EngineEnum"]["enum"]
    assert set(doc["paths"]["/api/models/"]["post"]["requestBody"]["content"]) == {"application/json"}
    assert "413" in paths["/api/models/"]["post"]["responses"]


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


def test_what_the_fuzz_found_stays_fixed(db):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(b.user("root", roles=("admin",)))
    b.node("gpu-1")
    # Invalid by the schema, accepted before: a yes/no filter read "null" as no filter at all.
    refused = api.get("/api/models/?declared=null")
    assert refused.status_code == 400
    assert (
        refused.json()["detail"]
        == "declared is a yes/no filter: give declared=true or declared=false, not 'null'."
    )
    # Valid by the schema, refused before: a profile id no profile has. And a form body, where only JSON
    # is taken now (the schema names no other type), is a 415, not read as strings.
    assert api.get("/api/replicas/?profile=999").json()["results"] == []
    form = api.post("/api/nodes/gpu-1/drain/", {"max_parallel": "2"}, format="multipart")
    assert form.status_code == 415 and form.json()["code"] == "unsupported_media_type"
