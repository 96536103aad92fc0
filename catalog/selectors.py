"""Reads that need care: the catalog as the planner sees it, in a fixed number of queries."""

from __future__ import annotations

from django.conf import settings
from django.db.models import Count, Q, QuerySet

from catalog.models import Card, GPUClass, Profile, Replica, ServedModel
from catalog.planning import GPUClassSpec, ModelSpec, NodeRoom, ProfileSpec, Shape

SHAPE_FIELDS = (
    "layers",
    "attention_heads",
    "kv_heads",
    "head_dim",
    "kv_bytes_per_token",
    "weight_bytes",
    "expert_bytes",
    "sliding_window",
    "sliding_layers",
    "context_length",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "replicated_bytes",
)


def shape_of(model: ServedModel) -> Shape:
    return Shape(attention=model.attention or None, **{f: getattr(model, f) for f in SHAPE_FIELDS})


def profile_spec(profile: Profile) -> ProfileSpec:
    return ProfileSpec(
        name=profile.name,
        engine=profile.engine,
        gpu_class=profile.gpu_class.name if profile.gpu_class_id else None,
        gpus_per_node=profile.gpus_per_node,
        tp=profile.tp,
        nodes=profile.nodes,
        pp=profile.pp,
        args=tuple(profile.args),
        env=tuple(sorted(profile.env.items())),
    )


def model_spec(model: ServedModel, profiles: list[Profile] | None = None) -> ModelSpec:
    """The model with its profiles; pass ``profiles`` when already loaded."""
    if profiles is None:
        profiles = list(model.profiles.select_related("gpu_class").order_by("name"))
    return ModelSpec(
        name=model.name,
        context_length=model.context_length,
        declared=model.declared,
        # Where a declared model is changed: the file it was read from, else the settings file.
        declared_in=(
            f"{model.declared_in or settings.LLMGW_CLUSTER_SETTINGS}, "
            "then python manage.py sync_cluster_settings"
            if model.declared
            else None
        ),
        shape=shape_of(model),
        profiles=tuple(profile_spec(p) for p in profiles),
    )


def gpu_class_specs() -> dict[str, GPUClassSpec]:
    return {
        c.name: GPUClassSpec(
            name=c.name,
            usable_bytes=c.usable_bytes,
            capability=c.compute_capability,
            total_bytes=c.memory_mib * 2**20,
        )
        for c in GPUClass.objects.all()
    }


def node_rooms(profile: Profile | None = None) -> list[NodeRoom]:
    """Each node's cards per class: how many, how many free, how many ``profile``'s live replicas hold.

    ``own`` counts only the replicas of the profile being changed: those are the ones an in-place
    restart stops, so only their cards come free (another profile's replicas of the same model keep
    theirs). One query, whatever the size of the fleet.
    """
    own = (
        Q(shard__replica__profile=profile, shard__replica__state__in=Replica.LIVE_STATES)
        if profile is not None
        else Q(pk__in=[])
    )
    rows = (
        Card.objects.values("node__name", "node__state", "gpu_class__name")
        .annotate(
            cards=Count("id"), free=Count("id", filter=Q(shard__isnull=True)), own=Count("id", filter=own)
        )
        .order_by("node__name", "gpu_class__name")
    )
    return [
        NodeRoom(
            node=r["node__name"],
            ready=r["node__state"] == "ready",
            gpu_class=r["gpu_class__name"],
            cards=r["cards"],
            free=r["free"],
            own=r["own"],
        )
        for r in rows
    ]


def live_replicas(profile: Profile) -> QuerySet[Replica]:
    return Replica.objects.filter(profile=profile, state__in=Replica.LIVE_STATES)
