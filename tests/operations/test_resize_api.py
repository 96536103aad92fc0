"""POST /api/models/{name}/gpus/ and /context/: a change answers the design's keys and writes one
audit entry, a dry run answers the same and saves nothing, a token's user is the one audited, and a
resize in place.

The refusals, access and bad input are in the test_resize_api_*.py files beside this one.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from audit.models import AuditEntry
from tests.operations.resize_api_support import (
    CHANGE_KEYS,
    client_for,
    context_url,
    gpus_url,
    llama_on_h100,
    resizer,
    saved_state,
)
from tests.support import builders as b

pytestmark = pytest.mark.django_db


# -- success ------------------------------------------------------------------------------------


def test_a_resize_answers_the_change_with_the_design_keys_and_writes_one_audit_entry():
    p = llama_on_h100(gpus=1, args=["--max-model-len", "32768", "--tensor-parallel-size=1"])
    alice = resizer()
    response = client_for(alice).post(gpus_url(), {"gpus": 2}, format="json", HTTP_X_REQUEST_ID="req-42")

    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == CHANGE_KEYS
    assert {
        k: body[k]
        for k in (
            "model",
            "profile",
            "engine",
            "gpu_class",
            "before",
            "after",
            "args",
            "restarted",
            "in_place",
            "kind",
        )
    } == {
        "model": "llama-3.1-8b",
        "profile": "h100",
        "engine": "vllm",
        "gpu_class": "h100-80g",
        "before": 1,
        "after": 2,
        "args": ["--max-model-len", "32768"],
        "restarted": 0,
        "in_place": False,
        "kind": "gpus",
    }
    # 16060522496 / 2 + 131072 x 32768 / 2 + vLLM's terms at TP 2 on an 80 GiB
    # card: outside PyTorch 0.35, NVLink buffers 1.8, CUDA graphs 1 GiB.
    assert body["per_card"] == "12.6 GiB on each of 2 cards, of 71.7 GiB usable on each"
    assert body["room"] == {
        "in_place": False,
        "beside": ["gpu-1"],
        "beside_count": 1,
        "in_place_nodes": ["gpu-1"],
        "in_place_count": 1,
        "places": [],  # no replica runs, so nothing is restarted
    }

    p.refresh_from_db()
    assert (p.tp, p.gpus_per_node, p.revision) == (2, 2, 2)
    (entry,) = AuditEntry.objects.all()
    assert (entry.via, entry.user, entry.actor, entry.action, entry.request_id) == (
        "api",
        alice,
        "alice",
        "resize",
        "req-42",
    )
    assert (entry.before["tp"], entry.after["tp"]) == (1, 2)
    assert (entry.before["gpus_per_node"], entry.after["gpus_per_node"]) == (1, 2)
    assert (entry.before["revision"], entry.after["revision"]) == (1, 2)
    assert entry.before["args"] == ["--max-model-len", "32768", "--tensor-parallel-size=1"]
    assert entry.after["args"] == ["--max-model-len", "32768"]


def test_a_resize_with_a_token_is_audited_as_the_tokens_user():
    llama_on_h100(gpus=1)
    bot = resizer("bot")
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {b.token(bot)}")
    assert c.post(gpus_url(), {"gpus": 4}, format="json").status_code == 200
    (entry,) = AuditEntry.objects.exclude(object_type="token")
    assert (entry.user, entry.via) == (bot, "api")


def test_a_dry_run_answers_the_change_and_saves_nothing():
    llama_on_h100(gpus=1)
    c = client_for(resizer())
    before = saved_state()
    preview = c.post(gpus_url(), {"gpus": 2, "dry_run": True}, format="json")
    assert preview.status_code == 200
    assert saved_state() == before

    done = c.post(gpus_url(), {"gpus": 2}, format="json")
    assert preview.json() == done.json()
    assert saved_state() != before


def test_a_context_change_answers_tokens_before_and_after_and_is_audited():
    p = llama_on_h100(gpus=1, args=["--max-model-len", "32768", "--enable-prefix-caching"])
    response = client_for(resizer()).post(context_url(), {"tokens": 65536}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == CHANGE_KEYS
    assert (body["kind"], body["before"], body["after"]) == ("context", 32768, 65536)
    assert body["args"] == ["--enable-prefix-caching", "--max-model-len", "65536"]
    assert body["memory"]["kv"] == 65536 * 131072 and body["memory"]["context"] == 65536
    p.refresh_from_db()
    assert (p.args, p.revision) == (body["args"], 2)
    (entry,) = AuditEntry.objects.all()
    assert (entry.action, entry.via, entry.after["args"]) == ("set_context", "api", body["args"])


def test_in_place_resize_answers_in_place_when_only_the_models_own_cards_make_room():
    n = b.node("gpu-1", cards=4)
    p = b.profile(b.llama_8b(), "h100", gpus=2)
    b.replica(p, n, [0, 1])
    response = client_for(resizer()).post(gpus_url(), {"gpus": 4, "in_place": True}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["in_place"] is True
    assert response.json()["restarted"] == 1
    from operations.models import RestartOperation

    assert RestartOperation.objects.get(pk=response.json()["operation"]).in_place is True
