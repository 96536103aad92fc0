"""What the tests of POST /api/models/{name}/gpus/ and /context/ share: the keys a change answers,
a client and a user with or without the resize permission, the two URLs, the state a refusal must leave
alone, and llama-3.1-8b on an h100 node."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from audit.models import AuditEntry
from catalog.models import Profile
from tests.support import builders as b

DESIGN_KEYS = {
    "model",
    "profile",
    "engine",
    "gpu_class",
    "before",
    "after",
    "args",
    "per_card",
    "restarted",
    "in_place",
    "note",
}
# "nodes" and "stages": a replica across nodes (its ranks, and a pipeline engine's stages).
CHANGE_KEYS = DESIGN_KEYS | {"memory", "room", "kind", "operation", "launch", "nodes", "stages"}


def client_for(user=None) -> APIClient:
    c = APIClient()
    if user is not None:
        c.force_authenticate(user)
    return c


def user(name: str = "someone", *perms: str):
    """A user without a password: nothing here signs in by password, and hashing one is slow."""
    u = get_user_model().objects.create_user(username=name, password=None)
    u.user_permissions.add(
        *(
            Permission.objects.get(content_type__app_label=p.split(".")[0], codename=p.split(".")[1])
            for p in perms
        )
    )
    return u


def resizer(name: str = "alice"):
    return user(name, "catalog.resize_model")


def gpus_url(model: str = "llama-3.1-8b") -> str:
    return f"/api/models/{model}/gpus/"


def context_url(model: str = "llama-3.1-8b") -> str:
    return f"/api/models/{model}/context/"


def saved_state() -> list[tuple]:
    """Every profile as it runs, and how many audit entries: what a refusal must leave alone."""
    rows = Profile.objects.order_by("pk").values_list(
        "gpus_per_node", "tp", "nodes", "pp", "args", "env", "revision"
    )
    return [*map(tuple, rows), ("audit", AuditEntry.objects.count())]


def llama_on_h100(gpus: int = 1, args: list[str] | None = None, cards: int = 8):
    b.node("gpu-1", cards=cards)
    return b.profile(b.llama_8b(), "h100", gpus=gpus, args=args or ["--max-model-len", "32768"])
