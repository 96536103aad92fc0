"""What the tests of the operator pages share: the htmx header, a fleet of any size, llama-3.1-8b on an
h100 and a 70B model on two, a signed-in client, the API's sentence for a dry run, and a restart
operation."""

from __future__ import annotations

from django.test import Client
from rest_framework.test import APIClient

from catalog.models import Profile, ServedModel
from operations.models import RestartOperation, RestartStep
from tests.support import builders as b

HX = {"HTTP_HX_REQUEST": "true"}


# -- a fleet ----------------------------------------------------------------------------------------------


def fleet(size: int) -> None:
    """``size`` nodes of 8 cards and ``size`` models, each with a profile and a replica on two cards,
    one of them stale."""
    for i in range(size):
        n = b.node(f"gpu-{i:02d}")
        p = b.profile(b.llama_8b(f"model-{i:02d}"), "h100", gpus=2)
        b.replica(p, n, [0, 1], name=f"model-{i:02d}-1", port=8000 + i)
        b.replica(p, n, [2, 3], name=f"model-{i:02d}-2", port=9000 + i)
        Profile.objects.filter(pk=p.pk).update(revision=2)  # the second replica is now stale...
        p.replicas.filter(name=f"model-{i:02d}-1").update(revision=2)  # ...the first is not


def llama_on_h100() -> ServedModel:
    """llama-3.1-8b on one h100 card at 32k tokens, a replica on gpu-1; gpu-1 and gpu-2 have room."""
    n = b.node("gpu-1")
    b.node("gpu-2")
    m = b.llama_8b("llama-3.1-8b")
    p = b.profile(m, "h100", args=["--max-model-len", "32768"])
    b.replica(p, n, [0], name="llama-1")
    return m


def big_on_h100() -> ServedModel:
    """A 140 GB model on two h100 cards: it does not fit on one."""
    n = b.node("gpu-9")
    m = b.llama_8b(
        "big-70b",
        weight_bytes=140_000_000_000,
        attention_heads=64,
        layers=80,
        kv_bytes_per_token=2 * 80 * 8 * 128 * 2,
    )
    p = b.profile(m, "h100", gpus=2, args=["--max-model-len", "8192"])
    b.replica(p, n, [0, 1], name="big-1")
    return m


def signed_in(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def api_detail(model: str, body: dict) -> str:
    """The API's sentence for the same dry run, as a superuser would get it."""
    api = APIClient()
    api.force_authenticate(b.user("api-admin", "catalog.resize_model"))
    kind = "gpus" if "gpus" in body else "context"
    response = api.post(f"/api/models/{model}/{kind}/", {**body, "dry_run": True}, format="json")
    assert response.status_code >= 400, response.content
    return response.json()["detail"]


def operation(model: ServedModel, state: str = "running", **fields) -> RestartOperation:
    profile = model.profiles.get()
    op = RestartOperation.objects.create(
        model=model, profile=profile, state=state, requested_by_name="operator", via="ui", **fields
    )
    for replica in profile.replicas.all():
        RestartStep.objects.create(
            operation=op, old_replica=replica, node="gpu-1", cards=[3], state="waiting"
        )
    return op
