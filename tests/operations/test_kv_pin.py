"""Pinning a profile's KV pool to what its replicas measured: offered, then written through the audited,
policy-checked profile save, over the API."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from audit.models import AuditEntry
from base.errors import DomainError
from catalog.models import Profile
from operations.services.kv_pin import kv_pin
from tests.support import builders as b

pytestmark = pytest.mark.django_db

GIB = 2**30
MIB = 2**20


@pytest.fixture
def measured():
    model = b.llama_8b()
    profile = b.profile(model, args=["--max-num-seqs", "64"])
    node = b.node("gpu-a", cards=4)
    for i, kv in enumerate((30.5 * GIB + 12345, 31.25 * GIB)):
        r = b.replica(profile, node, [i], port=8000 + i)
        r.measured_memory = {"kv_cache": kv, "kv_tokens": 250_000}
        r.save()
    return profile


def test_the_pin_offered_is_the_smallest_measured_pool_rounded_down_to_a_mib_and_nothing_is_saved(measured):
    pin = kv_pin(model="llama-3.1-8b", profile="default")
    assert pin.kv_bytes == int(30.5 * GIB + 12345) // MIB * MIB
    assert pin.args_after == ["--max-num-seqs", "64", "--kv-cache-memory-bytes", str(pin.kv_bytes)]
    assert len(pin.measured_on) == 2 and not pin.applied
    assert Profile.objects.get(pk=measured.pk).args == ["--max-num-seqs", "64"]


def test_applying_it_over_the_api_saves_the_argument_audited_and_raises_the_revision(measured):
    client = APIClient()
    client.force_authenticate(b.user("ed", roles=("editor",)))
    url = "/api/models/llama-3.1-8b/profiles/default/pin-kv/"
    response = client.post(url, {"dry_run": False}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["applied"] and body["revision"] == 2
    saved = Profile.objects.get(pk=measured.pk)
    assert saved.args[-2:] == ["--kv-cache-memory-bytes", str(body["kv_bytes"])]
    entry = AuditEntry.objects.get(action="pin_kv")
    assert "--kv-cache-memory-bytes" in entry.message and entry.object_key == "llama-3.1-8b/default"
    # Again: its replicas measured the old revision; the new one has not started yet.
    again = client.post(url, {"dry_run": False}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "not_measured"


def test_nothing_measured_on_the_current_revision_and_engines_without_the_argument_are_refused(measured):
    measured.args = ["--max-num-seqs", "32"]
    measured.revision = 2
    measured.save()
    with pytest.raises(DomainError) as caught:
        kv_pin(model="llama-3.1-8b", profile="default")
    assert caught.value.code == "not_measured"
    trt = b.profile(b.llama_8b("llama-trt"), engine="trtllm")
    with pytest.raises(DomainError) as caught:
        kv_pin(model="llama-trt", profile=trt.name)
    assert caught.value.code == "not_pinnable" and "extra_llm_api_options" in caught.value.message


def test_the_upgrade_dry_run_over_the_api_changes_nothing(measured):
    from catalog.models import EngineDefault

    EngineDefault.objects.create(engine="vllm", version="0.19.1")
    client = APIClient()
    client.force_authenticate(b.user("op", roles=("operator",)))
    response = client.post("/api/releases/upgrade/", {"engine": "vllm", "release": "0.20.0"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["applied"] is False and [p["model"] for p in body["profiles"]] == ["llama-3.1-8b"]
    assert body["profiles"][0]["nodes_unknown"] == ["gpu-a"]  # its agent never reported
    assert EngineDefault.objects.get().version == "0.19.1"
    listed = client.get("/api/releases/").json()
    assert listed == {"defaults": {"vllm": "0.19.1"}, "check": None}
