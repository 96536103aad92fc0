"""Catalog serializers: they translate, the services decide."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from base.secrets import masked_env, unmasked_env
from catalog.models import Card, GPUClass, Node, Profile, Replica, ServedModel
from catalog.models.fleet import AGENT_TOKEN_MIN, agent_token_validator
from catalog.services.catalog import node_state_refusal
from planning.types import SHAPE_FIELDS


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="A plain sentence: what is wrong and how to fix it.")
    code = serializers.CharField(help_text="A stable machine-readable code.")


# The bounds the models' check constraints hold (catalog/models), said where a client reads them: the
# schema (a number at least 1), not only in the database's refusal.
_AT_LEAST_ONE = {"min_value": 1}


class GPUClassSerializer(serializers.ModelSerializer):
    class Meta:
        model = GPUClass
        fields = ["id", "name", "memory_mib", "usable_mib", "compute_capability"]
        extra_kwargs = {
            "memory_mib": _AT_LEAST_ONE,
            "usable_mib": {
                **_AT_LEAST_ONE,
                "help_text": "What an engine may fill on one card, in MiB: from 1 to memory_mib.",
            },
        }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # Two fields together, which no schema can say: refused under a code of its own.
        current = self.instance if isinstance(self.instance, GPUClass) else None
        memory = attrs.get("memory_mib", getattr(current, "memory_mib", None))
        usable = attrs.get("usable_mib", getattr(current, "usable_mib", None))
        if memory is not None and usable is not None and usable > memory:
            raise serializers.ValidationError(
                {
                    "usable_mib": f"usable_mib ({usable}) is above memory_mib ({memory}): give at most the card's memory."
                },
                code="usable_above_memory",
            )
        return attrs


class CardSerializer(serializers.ModelSerializer):
    gpu_class: serializers.SlugRelatedField[GPUClass] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    replica = serializers.SerializerMethodField()

    class Meta:
        model = Card
        fields = ["index", "gpu_class", "replica"]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_replica(self, card: Card) -> str | None:
        shard = getattr(card, "shard", None)
        return shard.replica.name if shard is not None else None


class NodeSerializer(serializers.ModelSerializer):
    # CardSerializer's shape, written directly: a page of 100 nodes is 800 cards, and a serializer
    # per card was most of the answer's time.
    cards = serializers.SerializerMethodField()
    agent_token = serializers.CharField(
        write_only=True,
        min_length=AGENT_TOKEN_MIN,
        max_length=200,
        validators=[agent_token_validator],
        help_text="Never shown again once set: 32 to 200 printable ASCII characters without spaces.",
    )
    last_seen_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="When its agent last answered the reconciler."
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "agent_url",
            "agent_token",
            "fabric_domain",
            "state",
            "reachable",
            "last_seen_at",
            "unreachable_reason",
            "orphans",
            "driver_version",
            "cuda_version",
            "arch",
            "engines",
            "facts_at",
            "cards",
        ]
        # What the reconciler learnt from the node's agent: read here, written by it alone. The state:
        # cordon's, uncordon's and drain's (their own endpoints), never an edit's.
        read_only_fields = [
            "state",
            "reachable",
            "unreachable_reason",
            "orphans",
            "driver_version",
            "cuda_version",
            "arch",
            "engines",
            "facts_at",
        ]

    @extend_schema_field(CardSerializer(many=True, read_only=True))
    def get_cards(self, node: Node) -> list[dict[str, Any]]:
        # A list names each holder by its replica's id, which the view names (NodeViewSet.list).
        by_id = self.context.get("holders_by_id", False)
        out = []
        for card in node.cards.all():
            shard = getattr(card, "shard", None)
            holder = None if shard is None else shard.replica_id if by_id else shard.replica.name
            out.append({"index": card.index, "gpu_class": card.gpu_class.name, "replica": holder})
        return out

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        node = self.instance
        given = self.initial_data.get("state") if isinstance(self.initial_data, dict) else None
        now = node.state if isinstance(node, Node) else Node.State.READY
        if given is not None and given != now:
            # Read-only, so DRF would drop it and answer 200: refused instead, saying where it is changed.
            raise serializers.ValidationError(
                {"state": node_state_refusal(node.name if isinstance(node, Node) else "")},
                code="state_by_operation",
            )
        moved = isinstance(node, Node) and "agent_url" in attrs and attrs["agent_url"] != node.agent_url
        if moved and "agent_token" not in attrs:
            raise serializers.ValidationError(
                {"agent_token": "Changing agent_url needs the agent token again, for the new agent."}
            )
        return attrs


class ProfileSerializer(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="name", queryset=ServedModel.objects.all())
    gpu_class = serializers.SlugRelatedField(
        slug_field="name", queryset=GPUClass.objects.all(), allow_null=True, required=False
    )
    args = serializers.ListField(child=serializers.CharField(allow_blank=True), required=False)
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    cards = serializers.IntegerField(read_only=True, help_text="Cards one replica uses.")

    class Meta:
        model = Profile
        fields = [
            "id",
            "model",
            "name",
            "engine",
            "engine_version",
            "gpu_class",
            "gpus_per_node",
            "tp",
            "nodes",
            "pp",
            "args",
            "env",
            "revision",
            "cards",
        ]
        # The release is changed by an upgrade, whose dry run comes first (POST /api/releases/upgrade/
        # with the profile named), never by an edit.
        read_only_fields = ["revision", "engine_version"]
        validators: list[Any] = []  # uniqueness is the service's and the database's to say
        extra_kwargs = {"gpus_per_node": _AT_LEAST_ONE, "tp": _AT_LEAST_ONE, "nodes": _AT_LEAST_ONE}

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # The engines the registry knows, named in the schema (planning/engines.py; loaded once).
        from planning import engines

        known = sorted(engines.registry())
        fields["engine"] = serializers.ChoiceField(
            choices=known,
            error_messages={
                "invalid_choice": f"There is no engine {{input!r}}; the registry knows {', '.join(known)}."
            },
        )
        return fields

    def to_representation(self, instance: Profile) -> dict[str, Any]:
        data = super().to_representation(instance)
        # Values the launch policy marks secret (API keys) are write-only.
        data["env"] = masked_env(instance.engine, data.get("env") or {})
        return data

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        """A placeholder sent back (as GET showed it) keeps the stored secret."""
        if self.instance is not None and isinstance(self.instance, Profile):
            return unmasked_env(value, self.instance.env or {})
        return value


class _Profiles(serializers.ListSerializer):
    """A model's profiles, from the plain list a list of models loads them as (``profile_list``:
    ``ServedModelViewSet.get_queryset``), else from its prefetched profiles."""

    def get_attribute(self, instance: Any) -> Any:
        listed = instance.__dict__.get("profile_list")
        return super().get_attribute(instance) if listed is None else listed


class ProfileInModelSerializer(ProfileSerializer):
    class Meta(ProfileSerializer.Meta):
        fields = [f for f in ProfileSerializer.Meta.fields if f != "model"]
        list_serializer_class = _Profiles


class ServedModelSerializer(serializers.ModelSerializer):
    profiles = ProfileInModelSerializer(many=True, read_only=True)

    class Meta:
        model = ServedModel
        fields = [
            "id",
            "name",
            "source",
            "context_length",
            *SHAPE_FIELDS,
            "declared",
            "declared_in",
            "profiles",
        ]
        read_only_fields = ["declared", "declared_in"]
        extra_kwargs = {
            field: _AT_LEAST_ONE
            for field in (
                "context_length",
                "layers",
                "attention_heads",
                "kv_heads",
                "head_dim",
                "weight_bytes",
                "sliding_window",
            )
        }


class ShardSerializer(serializers.Serializer):
    node = serializers.CharField()
    cards = serializers.ListField(child=serializers.IntegerField())


class ReplicaSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="profile.model.name", read_only=True)
    profile = serializers.PrimaryKeyRelatedField(queryset=Profile.objects.all())
    stale = serializers.SerializerMethodField()
    shards = serializers.SerializerMethodField()

    class Meta:
        model = Replica
        fields = [
            "id",
            "name",
            "model",
            "profile",
            "port",
            "state",
            "revision",
            "engine_version",
            "stale",
            "shards",
        ]
        read_only_fields = ["state", "revision", "engine_version"]
        extra_kwargs = {"port": {"min_value": 1, "max_value": 65535}}

    def get_stale(self, replica: Replica) -> bool:
        return replica.is_stale

    @extend_schema_field(ShardSerializer(many=True))
    def get_shards(self, replica: Replica) -> list[dict[str, Any]]:
        by_node: dict[str, list[int]] = {}
        # A list loads them as a plain list (catalog/api/views.py, ReplicaViewSet.get_queryset): a
        # queryset made for each replica's prefetched shards cost more than reading them.
        shards = replica.__dict__.get("shard_list")
        for shard in replica.shards.all() if shards is None else shards:
            by_node.setdefault(shard.card.node.name, []).append(shard.card.index)
        return [{"node": node, "cards": sorted(cards)} for node, cards in sorted(by_node.items())]
