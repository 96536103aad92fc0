"""Bad input to the API is a clear 4xx in the one shape {"detail", "code"}: list pages with a
bound on their size and offset, and 404s in the operators' words."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.support import builders as b

pytestmark = pytest.mark.django_db


@pytest.fixture
def api() -> APIClient:
    c = APIClient()
    c.force_authenticate(b.user("reader"))
    return c


@pytest.mark.parametrize("url", ["/api/models/", "/api/nodes/", "/api/replicas/", "/api/operations/"])
@pytest.mark.parametrize(
    "query, name",
    [
        ("limit=99999999999999999999", "limit"),
        ("limit=1001", "limit"),
        ("offset=10000000000000000000", "offset"),
    ],
)
def test_a_page_too_large_or_too_far_is_refused_with_a_sentence(api, url, query, name):
    response = api.get(f"{url}?{query}")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid" and body["detail"].startswith(f"{name}: {name} must be a whole number")


def test_a_page_within_the_bounds_answers(api):
    b.llama_8b("llama")
    body = api.get("/api/models/?limit=1000&offset=0").json()
    assert [m["name"] for m in body["results"]] == ["llama"]


@pytest.mark.parametrize(
    "url, sentence",
    [
        ("/api/models/nope/", "No model 'nope' in the catalog."),
        ("/api/nodes/nope/", "No node 'nope' in the catalog."),
        ("/api/gpu-classes/nope/", "No GPU class 'nope' in the catalog."),
        ("/api/operations/999/", "No restart operation '999' here."),
        ("/api/no-such-thing/", "No API endpoint at /api/no-such-thing/: /api/docs/ lists them."),
    ],
)
def test_a_404_says_what_is_missing_in_the_one_shape(api, url, sentence):
    response = api.get(url)
    assert response.status_code == 404
    assert response.json() == {"detail": sentence, "code": "not_found"}
