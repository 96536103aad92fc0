"""POST /api/models/{name}/gpus/ and /context/: bad input is a 400 with a clear sentence and saves
nothing; the schema documents both operations."""

from __future__ import annotations

import json

import pytest

from tests.operations.resize_api_support import (
    client_for,
    context_url,
    gpus_url,
    llama_on_h100,
    resizer,
    saved_state,
    user,
)

pytestmark = pytest.mark.django_db


# -- bad input -----------------------------------------------------------------------------------

BAD_GPUS = [
    ({"gpus": "4"}, "gpus", "whole number"),
    ({"gpus": 4.5}, "gpus", "whole number"),
    ({"gpus": 4.0}, "gpus", "whole number"),
    ({"gpus": True}, "gpus", "true/false"),
    ({"gpus": None}, "gpus", "null"),
    ({"gpus": [4]}, "gpus", "whole number"),
    ({"gpus": {"n": 4}}, "gpus", "whole number"),
    ({}, "gpus", "required"),
    ({"profile": "h100"}, "gpus", "required"),
    ({"gpus": 2, "extra": 1}, "extra", "unknown field"),
    ({"gpus": 2, "inplace": True}, "inplace", "in_place"),  # a misspelt option is not ignored
    ({"gpus": 2, "dry_run": "perhaps"}, "dry_run", "boolean"),
    ({"gpus": 2, "profile": None}, "profile", "null"),
    ({"gpus": 0}, "1 to 64", ""),
    ({"gpus": 65}, "1 to 64", ""),
    ({"gpus": -1}, "1 to 64", ""),
    ({"gpus": 10**30}, "1 to 64", ""),
    ({"gpus": 2, "profile": "nope"}, "nope", "no profile"),
]


@pytest.mark.parametrize("body, names, says", BAD_GPUS, ids=lambda v: json.dumps(v)[:40])
def test_bad_resize_input_is_a_400_with_a_clear_sentence_and_saves_nothing(body, names, says):
    llama_on_h100()
    before = saved_state()
    response = client_for(resizer()).post(gpus_url(), body, format="json")
    assert response.status_code == 400, response.content
    answer = response.json()
    assert set(answer) == {"detail", "code"}
    assert answer["code"] in ("invalid", "gpus_range", "no_profile"), answer
    assert names in answer["detail"] and says in answer["detail"], answer
    assert saved_state() == before


BAD_BODIES = [
    ("[2]", "application/json", "expected a dictionary"),
    ('"4"', "application/json", "expected a dictionary"),
    ("gpus=2", "application/json", "json parse error"),
    ('{"gpus": 2', "application/json", "json parse error"),
    ("", "application/json", "required"),
]


@pytest.mark.parametrize("raw, content_type, says", BAD_BODIES)
def test_a_body_that_is_not_a_json_object_is_a_400_and_saves_nothing(raw, content_type, says):
    llama_on_h100()
    before = saved_state()
    response = client_for(resizer()).generic("POST", gpus_url(), raw, content_type=content_type)
    assert response.status_code == 400, response.content
    assert says in response.json()["detail"].lower()
    assert response.json()["code"] in ("invalid", "parse_error")
    assert saved_state() == before


def test_a_form_encoded_number_is_a_string_and_is_refused():
    llama_on_h100()
    response = client_for(resizer()).post(gpus_url(), {"gpus": "2"})  # multipart: every value a string
    assert response.status_code == 400
    assert "whole number" in response.json()["detail"]


@pytest.mark.parametrize(
    "body, says",
    [
        ({"tokens": "8192"}, "whole number"),
        ({"tokens": 8192.0}, "whole number"),
        ({"tokens": False}, "true/false"),
        ({"tokens": -5}, "1 to 131072"),
        ({}, "required"),
        ({"tokens": 8192, "gpus": 2}, "unknown field"),
    ],
)
def test_bad_context_input_is_a_400_and_saves_nothing(body, says):
    llama_on_h100()
    before = saved_state()
    response = client_for(resizer()).post(context_url(), body, format="json")
    assert response.status_code == 400, response.content
    assert says in response.json()["detail"]
    assert saved_state() == before


def test_the_schema_documents_both_operations():
    response = client_for(user()).get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    assert "/api/models/{name}/gpus/" in paths and "/api/models/{name}/context/" in paths
