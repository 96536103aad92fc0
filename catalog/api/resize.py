"""Resize and context over the API: each a view with its input and output serializers, calling its service."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from catalog.api.inputs import StrictInput, StrictIntegerField
from catalog.api.permissions import CanResize
from catalog.planning.types import ROOM_NODES_NAMED
from catalog.services.resize import model_resize, model_set_context


class ResizeInput(StrictInput):
    gpus = StrictIntegerField(help_text="Cards one replica is to use, 1 to 64.")
    profile = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="The profile to change; needed when the model has several on cards.",
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
    tokens = StrictIntegerField(help_text="Context length in tokens, 1 to the model's.")
    profile = serializers.CharField(required=False, allow_blank=True, default="")
    in_place = serializers.BooleanField(required=False, default=False)
    dry_run = serializers.BooleanField(required=False, default=False)


class MemorySerializer(serializers.Serializer):
    cards = serializers.IntegerField()
    weights = serializers.IntegerField(help_text="Bytes of weights on each card.")
    kv = serializers.IntegerField(help_text="Bytes of KV cache on each card for the context.")
    overhead = serializers.IntegerField(help_text="The engine's overhead on each card, bytes.")
    need = serializers.IntegerField()
    budget = serializers.IntegerField(allow_null=True, help_text="The class's usable memory per card, bytes.")
    # DRF's metaclass moves declared fields off the class, so this field does not shadow
    # Serializer.context at run time; the stubs cannot know that, and the API's key is "context".
    context = serializers.IntegerField()  # type: ignore[assignment]
    fits = serializers.BooleanField()


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


class ChangeSerializer(serializers.Serializer):
    model = serializers.CharField()
    profile = serializers.CharField()
    engine = serializers.CharField()
    gpu_class = serializers.CharField(allow_null=True)
    kind = serializers.ChoiceField(choices=["gpus", "context"])
    before = serializers.IntegerField(allow_null=True, help_text="Cards (resize) or tokens (context) before.")
    after = serializers.IntegerField()
    args = serializers.ListField(child=serializers.CharField())
    per_card = serializers.CharField(allow_blank=True)
    restarted = serializers.IntegerField(help_text="Replicas being restarted on the new profile.")
    in_place = serializers.BooleanField()
    note = serializers.CharField(allow_blank=True, help_text="What could not be checked, said once.")
    memory = MemorySerializer(allow_null=True)
    room = RoomSerializer(allow_null=True)
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
        "ambiguous_profile, unchanged, capability, heads, single_card_engine, memory, "
        "context_range, or invalid input",
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
    permission_classes = [CanResize]

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
            profile=v["profile"] or None,
            in_place=v["in_place"],
            dry_run=v["dry_run"],
        )
        return Response(change.as_dict())


class ContextView(APIView):
    permission_classes = [CanResize]

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
