"""Resize and context over the API: each a view with its input and output serializers, calling its service."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from base.api.inputs import StrictInput, StrictIntegerField
from base.rules import Rule
from operations.services.resize import model_resize, model_set_context
from planning.rules import MAX_CARDS
from planning.types import ROOM_NODES_NAMED

MAX_TOKENS = 2**31 - 1  # what a model's context_length can hold in the database


class ResizeInput(StrictInput):
    gpus = StrictIntegerField(
        bounds=(1, MAX_CARDS), help_text=f"Cards one replica is to use, 1 to {MAX_CARDS}."
    )
    profile = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="The profile to change; needed when the model has several on cards.",
    )
    nodes = StrictIntegerField(
        required=False,
        default=None,
        allow_null=True,
        bounds=(1, MAX_CARDS),
        help_text="The nodes one replica spans, a rank on each with gpus / nodes cards; it must divide "
        "gpus. Left out: one node when one has the cards, else the fewest nodes that divide them evenly.",
    )
    in_place = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Stop each replica before its replacement starts, when no node "
        "has the cards free beside it. The model does not answer while "
        "the new one loads.",
    )
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="Run every check, save nothing."
    )


class ContextInput(StrictInput):
    tokens = StrictIntegerField(
        bounds=(1, MAX_TOKENS), help_text="Context length in tokens, 1 to the model's."
    )
    profile = serializers.CharField(required=False, allow_blank=True, default="")
    in_place = serializers.BooleanField(required=False, default=False)
    dry_run = serializers.BooleanField(required=False, default=False)


class TermSerializer(serializers.Serializer):
    name = serializers.CharField(
        help_text="activation, non_torch, comm_buffers, cuda_graph, runtime or reserved."
    )
    bytes = serializers.IntegerField()
    how = serializers.CharField(help_text="How the figure was worked out.")
    # The API's key is "source"; DRF moves declared fields off the class, so it shadows nothing at run time.
    source = serializers.CharField(  # type: ignore[assignment]
        help_text="Where the engine's figure comes from, by version and file."
    )
    inside = serializers.BooleanField(help_text="False for a term the engine keeps outside its budget.")


class MemorySerializer(serializers.Serializer):
    cards = serializers.IntegerField()
    weights = serializers.IntegerField(help_text="Bytes of weights on each card.")
    kv = serializers.IntegerField(help_text="Bytes of KV cache on each card for one sequence of the context.")
    overhead = serializers.IntegerField(help_text="The sum of the terms inside the budget, bytes.")
    need = serializers.IntegerField(help_text="weights + kv + overhead, bytes.")
    budget = serializers.IntegerField(
        allow_null=True,
        help_text="What the engine may fill on a card: its own budget capped by the class's usable memory, bytes.",
    )
    # DRF's metaclass moves declared fields off the class, so this field does not shadow
    # Serializer.context at run time; the stubs cannot know that, and the API's key is "context".
    context = serializers.IntegerField()  # type: ignore[assignment]
    fits = serializers.BooleanField()
    terms = TermSerializer(many=True, help_text="Each term beside weights and KV cache.")
    activation = serializers.IntegerField(required=False, help_text="Each term's bytes, by its name.")
    non_torch = serializers.IntegerField(required=False)
    comm_buffers = serializers.IntegerField(required=False)
    cuda_graph = serializers.IntegerField(required=False)
    runtime = serializers.IntegerField(required=False)
    reserved = serializers.IntegerField(required=False)
    engine_budget = serializers.IntegerField(allow_null=True)
    class_budget = serializers.IntegerField(allow_null=True)
    budget_how = serializers.CharField(allow_blank=True)
    kv_tokens = serializers.IntegerField(allow_null=True, help_text="Tokens the KV cache will hold.")
    sequences = serializers.FloatField(allow_null=True, help_text="Full-context sequences that is.")


class RankPlaceSerializer(serializers.Serializer):
    rank = serializers.IntegerField(help_text="The rank of the replica's group; rank 0 serves.")
    node = serializers.CharField()
    cards = serializers.ListField(child=serializers.IntegerField())


class PlacementSerializer(serializers.Serializer):
    replica = serializers.CharField()
    in_place = serializers.BooleanField()
    ranks = RankPlaceSerializer(
        many=True, help_text="Each rank's node and cards, rank 0 first: one rank for a replica on one node."
    )
    node = serializers.CharField(help_text="Rank 0's node.")
    cards = serializers.ListField(child=serializers.IntegerField(), help_text="Rank 0's cards.")


class RoomSerializer(serializers.Serializer):
    in_place = serializers.BooleanField()
    beside = serializers.ListField(
        child=serializers.CharField(),
        help_text=f"Nodes with the cards free beside the running replicas: the first {ROOM_NODES_NAMED} by name.",
    )
    beside_count = serializers.IntegerField(help_text="How many nodes have the cards free beside.")
    in_place_nodes = serializers.ListField(
        child=serializers.CharField(),
        help_text=f"Nodes with the cards free once this profile's replicas stop: the first {ROOM_NODES_NAMED}.",
    )
    in_place_count = serializers.IntegerField(help_text="How many nodes have them free that way.")
    places = PlacementSerializer(
        many=True, help_text="Where the restart puts each replica (every rank of it), in its order."
    )


class StageSerializer(serializers.Serializer):
    stage = serializers.IntegerField(help_text="The pipeline stage, and the rank that runs it.")
    first_layer = serializers.IntegerField()
    layers = serializers.IntegerField()
    holds = serializers.CharField(help_text="Its layers, and the embedding (first) or the head (last).")
    memory = MemorySerializer()


class ChangeSerializer(serializers.Serializer):
    model = serializers.CharField()
    profile = serializers.CharField()
    engine = serializers.CharField()
    gpu_class = serializers.CharField(allow_null=True)
    kind = serializers.ChoiceField(choices=["gpus", "context"])
    before = serializers.IntegerField(allow_null=True, help_text="Cards (resize) or tokens (context) before.")
    after = serializers.IntegerField()
    args = serializers.ListField(child=serializers.CharField())
    launch = serializers.ListField(
        child=serializers.CharField(),
        help_text="The engine's whole command line ({port}: each replica's own).",
    )
    per_card = serializers.CharField(allow_blank=True)
    restarted = serializers.IntegerField(help_text="Replicas being restarted on the new profile.")
    in_place = serializers.BooleanField()
    note = serializers.CharField(allow_blank=True, help_text="What could not be checked, said once.")
    memory = MemorySerializer(allow_null=True)
    room = RoomSerializer(allow_null=True)
    nodes = serializers.IntegerField(
        allow_null=True, help_text="The nodes one replica of the new profile spans (its ranks)."
    )
    stages = StageSerializer(
        many=True,
        help_text="A replica across nodes of a pipeline engine (vLLM): each stage's layers and memory, "
        "a stage a rank; memory is the fullest's. Empty otherwise.",
    )
    operation = serializers.IntegerField(
        allow_null=True,
        help_text="The restart operation started for the "
        "replicas on the old revision (GET /api/operations/{id}/), if any.",
    )


class ChangeErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.CharField()
    change = ChangeSerializer(required=False, help_text="What was worked out before the refusal.")


_refusals = {
    400: OpenApiResponse(
        ChangeErrorSerializer,
        description="Refused by a rule: gpus_range, no_profile, cpu_only, "
        "ambiguous_profile, unchanged, capability, heads, layers, single_card_engine, "
        "single_node_engine, nodes_range, memory, context_range, or invalid input",
    ),
    403: OpenApiResponse(
        ChangeErrorSerializer, description="Not signed in, or without the resize permission"
    ),
    404: OpenApiResponse(ChangeErrorSerializer, description="not_found"),
    409: OpenApiResponse(
        ChangeErrorSerializer, description="declared, busy, no_class, too_few_cards, no_room, no_room_beside"
    ),
}


class ResizeView(APIView):
    required_permission: Rule = "catalog.resize_model"

    @extend_schema(
        operation_id="models_gpus",
        request=ResizeInput,
        responses={200: ChangeSerializer, **_refusals},
        summary="Resize a model to N cards",
        examples=[OpenApiExample("four cards", value={"gpus": 4, "dry_run": True}, request_only=True)],
    )
    def post(self, request: Request, name: str) -> Response:
        data = ResizeInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        change = model_resize(
            name=name,
            gpus=v["gpus"],
            nodes=v["nodes"],
            profile=v["profile"] or None,
            in_place=v["in_place"],
            dry_run=v["dry_run"],
        )
        return Response(change.as_dict())


class ContextView(APIView):
    required_permission: Rule = "catalog.resize_model"

    @extend_schema(
        operation_id="models_context",
        request=ContextInput,
        responses={200: ChangeSerializer, **_refusals},
        summary="Change a model's context length",
    )
    def post(self, request: Request, name: str) -> Response:
        data = ContextInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        change = model_set_context(
            name=name,
            tokens=v["tokens"],
            profile=v["profile"] or None,
            in_place=v["in_place"],
            dry_run=v["dry_run"],
        )
        return Response(change.as_dict())
