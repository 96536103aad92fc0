"""The database itself refuses rows the catalog cannot hold."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from catalog.models import Card, GPUClass, Node, Profile, Replica, ServedModel, Shard
from tests.support import builders as b

pytestmark = pytest.mark.django_db


def refused(make) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        make()


def test_gpu_class_names_are_unique():
    b.gpu_class("h100-80g")
    refused(
        lambda: GPUClass.objects.create(name="h100-80g", memory_mib=1, usable_mib=1, compute_capability="9.0")
    )


def test_gpu_class_usable_memory_cannot_exceed_total_or_be_zero():
    refused(
        lambda: GPUClass.objects.create(name="x", memory_mib=100, usable_mib=101, compute_capability="9.0")
    )
    refused(lambda: GPUClass.objects.create(name="y", memory_mib=100, usable_mib=0, compute_capability="9.0"))
    refused(lambda: GPUClass.objects.create(name="z", memory_mib=0, usable_mib=0, compute_capability="9.0"))


def test_node_names_are_unique_and_state_is_known():
    b.node("gpu-1", cards=0)
    refused(lambda: Node.objects.create(name="gpu-1", agent_url="http://x", agent_token="t"))
    refused(lambda: Node.objects.create(name="gpu-2", agent_url="http://x", agent_token="t", state="melted"))


def test_a_card_index_is_unique_on_its_node_but_not_across_nodes():
    n1, n2 = b.node("gpu-1", cards=1), b.node("gpu-2", cards=1)
    refused(lambda: Card.objects.create(node=n1, index=0, gpu_class=b.gpu_class()))
    assert Card.objects.filter(index=0, node__in=[n1, n2]).count() == 2


def test_a_card_is_held_by_at_most_one_replica():
    n = b.node("gpu-1", cards=2)
    p = b.profile(b.llama_8b())
    b.replica(p, n, [0], name="r1")
    other = Replica.objects.create(name="r2", profile=p, port=8001, revision=1)
    refused(lambda: Shard.objects.create(replica=other, card=Card.objects.get(node=n, index=0)))


def test_model_names_are_unique_and_sizes_positive():
    b.llama_8b("m")
    refused(lambda: ServedModel.objects.create(name="m", source="x"))
    for field in (
        "context_length",
        "layers",
        "attention_heads",
        "kv_heads",
        "head_dim",
        "weight_bytes",
        "sliding_window",
    ):
        refused(lambda field=field: ServedModel.objects.create(name=f"bad-{field}", source="x", **{field: 0}))


def test_profile_names_are_unique_per_model_only():
    m1, m2 = b.llama_8b("m1"), b.llama_8b("m2")
    b.profile(m1, "default")
    b.profile(m2, "default")
    refused(lambda: b.profile(m1, "default"))


@pytest.mark.parametrize("field", ["gpus_per_node", "tp", "nodes", "revision"])
def test_profile_sizes_must_be_at_least_one(field):
    m = b.llama_8b()
    refused(lambda: Profile.objects.create(model=m, name="p", engine="vllm", **{field: 0}))


def test_replica_port_and_revision_must_be_in_range():
    p = b.profile(b.llama_8b())
    refused(lambda: Replica.objects.create(name="r", profile=p, port=0, revision=1))
    refused(lambda: Replica.objects.create(name="r", profile=p, port=70000, revision=1))
    refused(lambda: Replica.objects.create(name="r", profile=p, port=8000, revision=0))


def test_a_profile_in_use_cannot_be_removed_from_under_its_replicas():
    n = b.node("gpu-1", cards=1)
    p = b.profile(b.llama_8b())
    b.replica(p, n, [0])
    from django.db.models.deletion import ProtectedError

    with pytest.raises(ProtectedError):
        p.delete()
