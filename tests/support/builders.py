"""Small builders for catalog rows, written straight to the database (not audited).

Tests that are about the write path call the services instead.
"""

from __future__ import annotations

import itertools
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from catalog.models import Card, GPUClass, Node, Profile, Replica, ServedModel, Shard

_seq = itertools.count(1)


def gpu_class(
    name: str = "h100-80g", memory_mib: int = 81559, usable_mib: int = 73400, capability: str = "9.0"
) -> GPUClass:
    return GPUClass.objects.get_or_create(
        name=name,
        defaults={"memory_mib": memory_mib, "usable_mib": usable_mib, "compute_capability": capability},
    )[0]


def node(
    name: str | None = None,
    *,
    cards: int = 8,
    cls: GPUClass | None = None,
    state: str = "ready",
    agent_url: str = "http://127.0.0.1:9",
    agent_token: str = "agent-token-of-the-tests-0123456789",
) -> Node:
    cls = cls or gpu_class()
    n = Node.objects.create(
        name=name or f"node-{next(_seq)}", agent_url=agent_url, agent_token=agent_token, state=state
    )
    Card.objects.bulk_create(Card(node=n, index=i, gpu_class=cls) for i in range(cards))
    return n


def llama_8b(name: str = "llama-3.1-8b", **fields: Any) -> ServedModel:
    """Llama-3.1-8B's shape: 32 layers, 32 heads, 8 KV heads of 128, bf16."""
    shape = dict(
        source="meta-llama/Llama-3.1-8B-Instruct",
        context_length=131072,
        layers=32,
        attention_heads=32,
        kv_heads=8,
        head_dim=128,
        dtype="bfloat16",
        attention="gqa",
        kv_bytes_per_token=2 * 32 * 8 * 128 * 2,
        weight_bytes=16060522496,
    )
    shape.update(fields)
    return ServedModel.objects.create(name=name, **shape)


def profile(
    model: ServedModel,
    name: str = "default",
    *,
    engine: str = "vllm",
    cls: GPUClass | None = None,
    gpus: int = 1,
    args: list[str] | None = None,
    **fields: Any,
) -> Profile:
    return Profile.objects.create(
        model=model,
        name=name,
        engine=engine,
        gpu_class=cls or gpu_class(),
        gpus_per_node=gpus,
        tp=gpus if engine in ("vllm", "sglang", "trtllm") else 1,
        args=args or [],
        **fields,
    )


def replica(
    p: Profile,
    node_: Node,
    cards: list[int],
    *,
    name: str | None = None,
    port: int = 8000,
    state: str = "ready",
) -> Replica:
    r = Replica.objects.create(
        name=name or f"{p.model.name}-{next(_seq)}", profile=p, port=port, state=state, revision=p.revision
    )
    for i in cards:
        Shard.objects.create(replica=r, card=Card.objects.get(node=node_, index=i))
    return r


def user(
    username: str = "someone",
    *perms: str,
    password: str = "pw-for-tests-only-123",
    roles: tuple[str, ...] = ("viewer",),
):
    """A user in ``roles`` (a viewer unless told otherwise; ``roles=()`` for none) with ``perms`` besides."""
    u = get_user_model().objects.create_user(username=username, password=password)
    u.groups.set(Group.objects.filter(name__in=roles))
    for perm in perms:
        app, codename = perm.split(".")
        u.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return u


def token(owner: Any, name: str = "ci", days: int = 1) -> str:
    """A new API token's secret for ``owner``, made by the service (so its creation is audited)."""
    from access.services import token_create
    from base.actor import Actor, acting_as

    with acting_as(Actor(via="cli", name="pytest")):
        return token_create(user=owner, name=name, days=days)[1]
