"""Restarts over the API: start one for a model, list and read operations with their steps, cancel one."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from base.api.cached import KeptList
from base.api.inputs import StrictInput, StrictIntegerField, StrictNumberField
from base.rules import Rule
from catalog.api.serializers import ErrorSerializer
from catalog.models import Node, Profile, Replica, ServedModel
from catalog.services import cards as card_services
from operations.models import RestartOperation, RestartStep
from operations.selectors import operations_with_steps
from operations.services import drain
from operations.services.start import MAX_PARALLEL, MAX_READY_TIMEOUT, operation_cancel, restart_start


class RestartInput(StrictInput):
    replicas = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        allow_empty=False,
        min_length=1,  # what allow_empty=False holds, said in the schema (minItems)
        help_text="Live replicas of the model to restart. Default: the ones running an older profile revision.",
    )
    in_place = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="true: stop each replica before its replacement starts on the freed cards (the model does not "
        "answer while the new one loads). false: rolling only. Omitted: rolling where a node has room "
        "beside, in place where not.",
    )
    max_parallel = StrictIntegerField(
        required=False,
        default=1,
        min_value=1,
        max_value=MAX_PARALLEL,
        help_text="Replicas restarted at once.",
    )
    ready_timeout = StrictNumberField(
        required=False,
        default=600,
        min_value=1,
        max_value=MAX_READY_TIMEOUT,
        help_text="Seconds a replacement has to become ready before its step fails.",
    )
    settle_seconds = StrictNumberField(
        required=False,
        default=None,
        allow_null=True,
        min_value=0,
        max_value=MAX_READY_TIMEOUT,
        help_text="Seconds a replacement must stay ready before its old replica is stopped (as Kubernetes' "
        "minReadySeconds); one that falls over meanwhile fails its step and the old one keeps serving. "
        "Default: LLMGW_RESTART_SETTLE_SECONDS.",
    )
    stop_at_first_failure = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Start no new step once one failed. Default false: every replica is still tried, so a fault "
        "on one node does not leave the others on the old revision.",
    )


class _Steps(serializers.ListSerializer):
    """An operation's steps, from the plain list a list of operations loads them as (``step_list``:
    ``OperationViewSet.get_queryset``), else from its prefetched steps."""

    def get_attribute(self, instance: Any) -> Any:
        listed = instance.__dict__.get("step_list")
        return super().get_attribute(instance) if listed is None else listed


class RestartStepSerializer(serializers.ModelSerializer):
    # Null until the step has a replica on that side (a replacement not yet started, a removed one).
    old_replica: serializers.SlugRelatedField[Replica] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    new_replica: serializers.SlugRelatedField[Replica] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    cards = serializers.ListField(child=serializers.IntegerField(), read_only=True)
    ranks = serializers.SerializerMethodField(
        help_text="A replacement across nodes: each rank's node, cards and the state its agent last said "
        "([{rank, node, cards, state, reason}]); empty on one node. The specs are not shown."
    )

    def get_ranks(self, step: RestartStep) -> list[dict[str, Any]]:
        return [{k: r.get(k) for k in ("rank", "node", "cards", "state", "reason")} for r in step.ranks or []]

    class Meta:
        model = RestartStep
        list_serializer_class = _Steps
        fields = [
            "id",
            "old_replica",
            "new_replica",
            "node",
            "cards",
            "ranks",
            "in_place",
            "state",
            "reason",
            "started_at",
            "finished_at",
        ]


class RestartOperationSerializer(serializers.ModelSerializer):
    model: serializers.SlugRelatedField[ServedModel] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    profile: serializers.SlugRelatedField[Profile] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    requested_by = serializers.CharField(
        source="requested_by_name", read_only=True, help_text="Who asked (the user, or the command's name)."
    )
    mode = serializers.CharField(read_only=True)
    abandoned = serializers.CharField(
        source="abandoned_text",
        read_only=True,
        help_text='"abandoned: no worker has it (...)" while it is queued or running and no worker holds it; '
        "empty otherwise.",
    )
    abandoned_seconds = serializers.FloatField(
        read_only=True, allow_null=True, help_text="How long no worker has held it; null while one does."
    )
    serving_after = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="Replicas of the model ready when it ended."
    )
    steps = RestartStepSerializer(many=True, read_only=True)

    class Meta:
        model = RestartOperation
        fields = [
            "id",
            "model",
            "profile",
            "state",
            "mode",
            "in_place",
            "max_parallel",
            "ready_timeout",
            "settle_seconds",
            "stop_at_first_failure",
            "requested_by",
            "via",
            "cause",
            "target_revision",
            "reason",
            "created_at",
            "started_at",
            "finished_at",
            "heartbeat_at",
            "worker",
            "attempts",
            "cancel_requested",
            "abandoned",
            "abandoned_seconds",
            "serving_after",
            "steps",
        ]


_refusals = {
    400: OpenApiResponse(
        ErrorSerializer,
        description="invalid input, other_model, cpu_only, multi_node, several_profiles, unknown_engine",
    ),
    403: OpenApiResponse(ErrorSerializer, description="Not signed in, or without the restart permission"),
    404: OpenApiResponse(ErrorSerializer, description="not_found: no such model or replica"),
    409: OpenApiResponse(
        ErrorSerializer,
        description="busy (a restart of the model is under way), nothing_to_restart, not_live",
    ),
}


class RestartView(APIView):
    required_permission: Rule = "catalog.restart_model"

    @extend_schema(
        operation_id="models_restart",
        request=RestartInput,
        responses={202: RestartOperationSerializer, **_refusals},
        summary="Restart a model's replicas through the node agents",
        description="Starts an operation and answers at once (202); a worker runs it. Follow it at "
        "/api/operations/{id}/.",
        examples=[OpenApiExample("two at a time", value={"max_parallel": 2}, request_only=True)],
    )
    def post(self, request: Request, name: str) -> Response:
        data = RestartInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        operation = restart_start(
            model_name=name,
            replicas=v.get("replicas"),
            in_place=v["in_place"],
            max_parallel=v["max_parallel"],
            ready_timeout=v["ready_timeout"],
            settle_seconds=v["settle_seconds"],
            stop_at_first_failure=v["stop_at_first_failure"],
        )
        operation = operations_with_steps().get(pk=operation.pk)
        return Response(RestartOperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)


class OperationFilter(django_filters.FilterSet):
    model = django_filters.CharFilter(field_name="model__name", help_text="The model's name.")

    class Meta:
        model = RestartOperation
        fields = ["model", "state"]


def _columns(model: Any) -> list[str]:
    """Every column of ``model`` by field name (a foreign key's loads its id)."""
    return [f.name for f in model._meta.concrete_fields]


@extend_schema_view(
    list=extend_schema(summary="Restart operations, newest first"),
    retrieve=extend_schema(summary="A restart operation with its steps"),
)
class OperationViewSet(KeptList, viewsets.ReadOnlyModelViewSet):
    queryset = operations_with_steps()
    # The models' and profiles' names (the names' version: a model's other edits keep it), the restarts
    # and their steps; of the replicas only their names, a holder column, which raises the placement's
    # version (versions/triggers.py, ``HOLDER``, ``NAMED``): a replica's state changed, every few
    # seconds in a restart, reads nothing again. Each row is kept by its values too
    # (base/api/cached.py), so a restart's write serializes only the rows it changed.
    kept_areas = ("names", "placement", "operations")
    kept_rows = True

    def keep(self, data: Any) -> bool:
        # An active restart's "abandoned" figures are read from the clock: such a page is not kept.
        rows = data.get("results", data) if isinstance(data, dict) else data
        return not any(self.keep_row(row) is False for row in rows)

    def keep_row(self, row: dict[str, Any]) -> bool:
        return row["state"] not in RestartOperation.ACTIVE_STATES

    serializer_class = RestartOperationSerializer
    filterset_class = OperationFilter
    lookup_value_regex = r"\d+"
    # Reads need the operation's view permission; the one write, cancel, the restart permission.
    required_permission: Rule = {"GET": "operations.view_restartoperation", "POST": "catalog.restart_model"}

    def get_queryset(self) -> Any:
        # A list loads of the models, profiles and replicas only the names its rows show: their every
        # column (a replica's two JSON documents) built as objects was most of the answer's time after a
        # replica's state changed, which reads the page again. A column read that is not loaded costs a
        # query, and its row is not kept (base/api/cached.py).
        if self.action != "list":
            return super().get_queryset()
        steps = (
            RestartStep.objects.select_related("old_replica", "new_replica")
            .only(*_columns(RestartStep), "old_replica__name", "new_replica__name")
            .order_by("id")
        )
        return (
            RestartOperation.objects.select_related("model", "profile")
            .only(*_columns(RestartOperation), "model__name", "profile__name")
            # A plain list each (to_attr): a queryset made for each operation's steps cost more than reading them.
            .prefetch_related(Prefetch("steps", queryset=steps, to_attr="step_list"))
        )

    @extend_schema(
        request=None,
        summary="Cancel a restart: the steps under way finish, the others do not start",
        responses={
            200: RestartOperationSerializer,
            403: OpenApiResponse(ErrorSerializer, description="Without the restart permission"),
            404: OpenApiResponse(ErrorSerializer, description="not_found"),
            409: OpenApiResponse(ErrorSerializer, description="finished: it has already ended"),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        operation_id = int(pk or 0)
        operation_cancel(operation_id=operation_id)
        return Response(RestartOperationSerializer(operations_with_steps().get(pk=operation_id)).data)


# -- taking a node out of service, moving a replica (operations/services/drain.py) ----------------


class NodeStateSerializer(serializers.Serializer):
    node = serializers.CharField(help_text="The node's name.")
    state = serializers.CharField(help_text="ready, cordoned or down.")


class DrainInput(StrictInput):
    max_parallel = StrictIntegerField(
        required=False, default=1, min_value=1, max_value=MAX_PARALLEL, help_text="Replicas moved at once."
    )
    ready_timeout = StrictNumberField(
        required=False,
        default=600,
        min_value=1,
        max_value=MAX_READY_TIMEOUT,
        help_text="Seconds a replacement has to become ready before its step fails.",
    )
    dry_run = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Only say where each replica would go (200, nothing changed, not audited), or why the "
        "drain would be refused.",
    )


class MovePlanSerializer(serializers.Serializer):
    replica = serializers.CharField()
    model = serializers.CharField()
    state = serializers.CharField(help_text="Its state now: ready, loading, starting, or unknown.")
    from_node = serializers.CharField()
    from_cards = serializers.ListField(child=serializers.IntegerField())
    to_node = serializers.CharField()
    to_cards = serializers.ListField(child=serializers.IntegerField())
    from_ranks = serializers.ListField(
        child=serializers.DictField(),
        help_text="Every rank's place now ([{rank, node, cards}], rank 0 first; one on one node).",
    )
    to_ranks = serializers.ListField(
        child=serializers.DictField(),
        help_text="Every rank's place after: a replica across nodes moves whole.",
    )


class DrainPlanSerializer(serializers.Serializer):
    node = serializers.CharField()
    moves = MovePlanSerializer(many=True, help_text="Where each replica on the node would go.")


class DrainAnswerSerializer(serializers.Serializer):
    node = serializers.CharField()
    state = serializers.CharField()
    operations = RestartOperationSerializer(
        many=True, help_text="One restart per profile with replicas on it."
    )


class MoveInput(StrictInput):
    ready_timeout = StrictNumberField(
        required=False,
        default=600,
        min_value=1,
        max_value=MAX_READY_TIMEOUT,
        help_text="Seconds the replacement has to become ready before the move fails.",
    )
    to_node = serializers.CharField(
        required=False,
        default=None,
        allow_null=True,
        help_text="The node to move it to (another node with cards of its class); the best fit when absent.",
    )
    dry_run = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Only say where the replica would go (200, nothing changed, not audited), or why the move "
        "would be refused.",
    )


_node_refusals = {
    403: OpenApiResponse(ErrorSerializer, description="Not signed in, or without the restart permission"),
    404: OpenApiResponse(ErrorSerializer, description="not_found: no such node"),
    409: OpenApiResponse(
        ErrorSerializer,
        description="not_ready, not_cordoned, node_down, nothing_to_drain (no replica on it can be moved: "
        "no drain started), busy, no_room_beside (a replica has no place elsewhere)",
    ),
}


class _NodeStateView(APIView):
    # POST: the node's state changed by ``change`` (cordon or uncordon), answered with it. A comment,
    # not a docstring: the API docs show a view's docstring to their readers.

    required_permission: Rule = "catalog.restart_model"
    change: Any

    def post(self, request: Request, name: str) -> Response:
        node = type(self).change(node_name=name)
        return Response({"node": node.name, "state": node.state})


@extend_schema_view(
    post=extend_schema(
        request=None,
        responses={200: NodeStateSerializer, **_node_refusals},
        summary="Cordon a node: no new replica is placed on it; what runs there keeps running",
    )
)
class NodeCordonView(_NodeStateView):
    change = staticmethod(drain.node_cordon)


@extend_schema_view(
    post=extend_schema(
        request=None,
        responses={200: NodeStateSerializer, **_node_refusals},
        summary="Uncordon a node: it takes placements again",
    )
)
class NodeUncordonView(_NodeStateView):
    change = staticmethod(drain.node_uncordon)


_not_json = {
    415: OpenApiResponse(
        ErrorSerializer, description="unsupported_media_type: the body is not JSON (application/json)"
    )
}


class CardCordonInput(StrictInput):
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=card_services.CORDON_REASON_MAX,
        help_text="Why (e.g. 'Xid 79', 'ECC errors'), shown beside the card and in the audit log.",
    )


class CardStateSerializer(serializers.Serializer):
    node = serializers.CharField(help_text="The node's name.")
    index = serializers.IntegerField(help_text="The card's index on its node.")
    cordoned = serializers.BooleanField(help_text="Whether new replicas are kept off it.")
    cordon_reason = serializers.CharField(help_text="Why it is cordoned; empty when it is not.")


_card_refusals = {
    403: OpenApiResponse(ErrorSerializer, description="Not signed in, or without the restart permission"),
    404: OpenApiResponse(ErrorSerializer, description="not_found: no such node, or no such card on it"),
    409: OpenApiResponse(ErrorSerializer, description="card_cordoned, card_not_cordoned"),
}


def _card_answer(card: Any) -> Response:
    return Response(
        {
            "node": card.node.name,
            "index": card.index,
            "cordoned": card.cordoned,
            "cordon_reason": card.cordon_reason,
        }
    )


class CardCordonView(APIView):
    required_permission: Rule = "catalog.restart_model"
    parser_classes = [JSONParser]  # as the drain's

    @extend_schema(
        request=CardCordonInput,
        responses={200: CardStateSerializer, 400: _refusals[400], **_card_refusals, **_not_json},
        summary="Cordon one card: no new replica is placed on it; what runs on it keeps running",
    )
    def post(self, request: Request, name: str, index: int) -> Response:
        given = CardCordonInput(data=request.data)
        given.is_valid(raise_exception=True)
        return _card_answer(card_services.card_cordon(node_name=name, index=index, **given.validated_data))


class CardUncordonView(APIView):
    required_permission: Rule = "catalog.restart_model"

    @extend_schema(
        request=None,
        responses={200: CardStateSerializer, **_card_refusals},
        summary="Uncordon one card: it takes placements again",
    )
    def post(self, request: Request, name: str, index: int) -> Response:
        return _card_answer(card_services.card_uncordon(node_name=name, index=index))


class NodeDrainView(APIView):
    required_permission: Rule = "catalog.restart_model"
    # A JSON object or nothing: a form or multipart body carries no numbers, and one that does not
    # parse into the fields would drain on the defaults (refused with 415 instead).
    parser_classes = [JSONParser]

    @extend_schema(
        request=DrainInput,
        responses={
            202: DrainAnswerSerializer,
            200: DrainPlanSerializer,
            400: _refusals[400],
            **_node_refusals,
            **_not_json,
        },
        summary="Drain a node: cordon it and move each of its replicas to other nodes, rolling",
        description="Starts one restart per profile with replicas on the node (live ones, and unknown ones "
        "whose agent does not answer), each planned off it, and answers at once (202) with them; a worker "
        "runs them. All or nothing: when one profile's replicas have no place elsewhere, or nothing on the "
        "node can be moved, nothing starts, the node is left as it was, and the answer (409) says why. "
        "With dry_run, answers (200) where each replica would go, changing nothing.",
    )
    def post(self, request: Request, name: str) -> Response:
        given = DrainInput(data=request.data)
        given.is_valid(raise_exception=True)
        options = dict(given.validated_data)
        if options.pop("dry_run"):
            moves = drain.node_drain_plan(node_name=name, max_parallel=options["max_parallel"])
            return Response({"node": name, "moves": [m.as_dict() for m in moves]})
        operations = drain.node_drain(node_name=name, **options)
        node = Node.objects.get(name=name)
        ops = operations_with_steps().filter(pk__in=[op.pk for op in operations]).order_by("id")
        body = {
            "node": node.name,
            "state": node.state,
            "operations": RestartOperationSerializer(ops, many=True).data,
        }
        return Response(body, status=status.HTTP_202_ACCEPTED)


class ReplicaMoveView(APIView):
    required_permission: Rule = "catalog.restart_model"
    parser_classes = [JSONParser]  # as the drain's

    @extend_schema(
        request=MoveInput,
        responses={202: RestartOperationSerializer, 200: MovePlanSerializer, **_refusals, **_not_json},
        summary="Move a replica to another node: its replacement is ready there before it stops",
        description="To to_node, or the best fit on another node of its class. Refused (409) naming why: "
        "no_other_node (no other node has cards of its class), wrong_node, not_ready (the node chosen takes "
        "no replica), no_room. With dry_run, answers (200) where it would go, changing nothing.",
    )
    def post(self, request: Request, name: str) -> Response:
        given = MoveInput(data=request.data)
        given.is_valid(raise_exception=True)
        options = dict(given.validated_data)
        if options.pop("dry_run"):
            move = drain.replica_move_plan(replica_name=name, to_node=options["to_node"])
            return Response(move.as_dict())
        operation = drain.replica_move(replica_name=name, **options)
        return Response(
            RestartOperationSerializer(operations_with_steps().get(pk=operation.pk)).data,
            status=status.HTTP_202_ACCEPTED,
        )
