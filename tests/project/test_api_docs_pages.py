"""The API's docs in a browser: the schema shown as text (not downloaded), Swagger UI with a way back
to the app; clients asking for the OpenAPI types or JSON are answered as before."""

from __future__ import annotations

import pytest
import yaml
from django.test import Client

from tests.support import builders as b

pytestmark = pytest.mark.django_db

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


def signed_in() -> Client:
    client = Client()
    client.force_login(b.user("viewer"))
    return client


def test_a_browser_is_shown_the_schema_as_text():
    response = signed_in().get("/api/schema/", HTTP_ACCEPT=BROWSER_ACCEPT)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert "attachment" not in response.get("Content-Disposition", "")
    assert yaml.safe_load(response.content)["info"]["title"] == "llmgw-web API"


def test_clients_asking_for_the_openapi_types_or_json_are_answered_as_before():
    client = signed_in()
    as_json = client.get("/api/schema/?format=json", HTTP_ACCEPT=BROWSER_ACCEPT)
    assert as_json["Content-Type"].startswith("application/vnd.oai.openapi+json")
    assert as_json.json()["info"]["title"] == "llmgw-web API"
    assert client.get("/api/schema/")["Content-Type"].startswith("application/vnd.oai.openapi")
    typed = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert typed["Content-Type"].startswith("application/vnd.oai.openapi+json")


def test_swagger_ui_leads_back_to_the_app():
    page = signed_in().get("/api/docs/").content.decode()
    assert '<a href="/">← llmgw-web: the fleet</a>' in page
    assert 'id="swagger-ui"' in page and "/static/css/api-docs.css" in page
