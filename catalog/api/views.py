"""Catalog CRUD: each write goes through the entity's service."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import django_filters
from django import forms
from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from base.api.cached import KeptList
from base.rules import Rule, model_permissions
from catalog.api import serializers as s
from catalog.models import Card, GPUClass, Node, Profile, Replica, ServedModel, Shard
from catalog.services import catalog as services
from versions.cache import remembered

_errors = {
    400: OpenApiResponse(s.ErrorSerializer, description="Invalid input"),
    401: OpenApiResponse(s.ErrorSerializer, description="Not signed in: no valid token or session"),
    403: OpenApiResponse(
        s.ErrorSerializer, description="Missing the permission (its name and the roles that give it)"
    ),
    404: OpenApiResponse(s.ErrorSerializer, description="not_found: no such object"),
    409: OpenApiResponse(s.ErrorSerializer, description="Refused: declared, in use, or a conflict"),
}


class ServiceViewSet(KeptList, viewsets.ModelViewSet):
    # Its writes call ``save_service`` / ``delete_service``; its lists are kept under the catalog's
    # version (base/api/cached.py). (A comment, not a docstring: the schema shows a view's
    # docstring to the API's readers, and each subclass has its own.)

    save_service: Callable[..., Any]
    delete_service: Callable[..., Any]

    def perform_create(self, serializer: Any) -> None:
        instance = serializer.Meta.model(**serializer.validated_data)
        serializer.instance = type(self).save_service(instance=instance)

    def perform_update(self, serializer: Any) -> None:
        instance = serializer.instance
        for field, value in serializer.validated_data.items():
            setattr(instance, field, value)
        serializer.instance = type(self).save_service(instance=instance)

    def perform_destroy(self, instance: Any) -> None:
        type(self).delete_service(instance=instance)


def _crud_schema(name: str) -> Callable[[type], type]:
    """Summaries, and the truth of each write: create and update answer the object as saved."""

    def decorate(cls: type) -> type:
        body = cls.serializer_class  # type: ignore[attr-defined]
        return extend_schema_view(
            list=extend_schema(summary=f"Each {name}, filtered by the query's parameters"),
            retrieve=extend_schema(summary=f"One {name}"),
            create=extend_schema(responses={201: body, **_errors}, summary=f"Create a {name}"),
            update=extend_schema(responses={200: body, **_errors}, summary=f"Replace a {name}"),
            partial_update=extend_schema(responses={200: body, **_errors}, summary=f"Change a {name}"),
            destroy=extend_schema(responses={204: None, **_errors}, summary=f"Remove a {name}"),
        )(cls)

    return decorate


@_crud_schema("GPU class")
class GPUClassViewSet(ServiceViewSet):
    """Kinds of card: total and usable memory (the budget an engine may fill) and compute capability.

    Filter with ``?name=`` or ``?compute_capability=``. A class that profiles or cards use cannot be removed.
    """

    required_permission: Rule = model_permissions(GPUClass)
    queryset = GPUClass.objects.all()
    kept_areas = ("structure",)  # nothing of the replicas
    serializer_class = s.GPUClassSerializer
    filterset_fields = ["name", "compute_capability"]
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    save_service = staticmethod(services.gpu_class_save)
    delete_service = staticmethod(services.gpu_class_delete)


# Only what the answer shows of each card (NodeSerializer.get_cards): a page of 100 nodes is 800 cards,
# and their replicas' every column (two JSON documents each) built as objects was most of its first drawing.
_cards = Prefetch(
    "cards",
    queryset=Card.objects.select_related("gpu_class", "shard__replica")
    .only("node", "index", "gpu_class__name", "shard__card", "shard__replica__name")
    .order_by("index"),
)


# As ``_cards`` for a list: each card's holder by its replica's id, named after (NodeViewSet.list).
_card_holders = Prefetch(
    "cards",
    queryset=Card.objects.select_related("gpu_class", "shard")
    .only("node", "index", "gpu_class__name", "shard__card", "shard__replica")
    .order_by("index"),
)


@_crud_schema("node")
class NodeViewSet(ServiceViewSet):
    """The fleet's hosts: each one's agent URL, state (ready, cordoned, down) and cards, with the replica
    holding each card. Filter with ``?state=`` or ``?name=``. The agent token is write-only.
    """

    required_permission: Rule = model_permissions(Node)
    queryset = Node.objects.select_related("agent_contact").prefetch_related(_cards)
    # A list is kept under the hardware's, the placement's and the operations' versions (each node's
    # last answer to the reconciler), each card's holder kept as its replica's id and named per
    # request from the names kept under the placement's (``list``; a replica's name is a holder
    # column, which raises it: versions/triggers.py, ``HOLDER``): a replica's state flipped or a
    # model's edit reads nothing.
    kept_areas = ("fleet", "placement", "operations")

    serializer_class = s.NodeSerializer
    filterset_fields = ["state", "name"]
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    save_service = staticmethod(services.node_save)
    delete_service = staticmethod(services.node_delete)

    def get_queryset(self) -> Any:
        if self.action == "list":  # each card's holder by id (``list``): no replica joined
            return Node.objects.select_related("agent_contact").prefetch_related(_card_holders)
        return super().get_queryset()

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "holders_by_id": self.action == "list"}

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response = super().list(request, *args, **kwargs)
        data = response.data
        nodes = data["results"] if isinstance(data, dict) and "results" in data else data
        ids = tuple(sorted({c["replica"] for n in nodes for c in n["cards"] if c["replica"] is not None}))
        names = remembered(
            "api-node-holders",
            ["placement"],
            [ids],
            lambda: dict(Replica.objects.filter(pk__in=ids).values_list("id", "name")),
            request=request._request,
        )
        for n in nodes:
            for c in n["cards"]:
                if c["replica"] is not None:
                    c["replica"] = names.get(c["replica"])
        return response


@_crud_schema("model")
class ServedModelViewSet(ServiceViewSet):
    """The models served, with their shape (the figures the memory checks use; any may be unknown) and
    profiles. Filter with ``?declared=``, ``?attention=``, ``?profiles__engine=`` or
    ``?profiles__gpu_class__name=``. A model declared in the cluster's settings file is read-only here.
    """

    required_permission: Rule = model_permissions(ServedModel)
    queryset = ServedModel.objects.prefetch_related(
        Prefetch("profiles", queryset=Profile.objects.select_related("gpu_class"))
    )
    kept_areas = (
        "structure",
    )  # the models and their profiles (their classes' names), nothing of the replicas
    kept_rows = True  # a model's edit serializes that model again, not the page (base/api/cached.py)
    serializer_class = s.ServedModelSerializer
    filterset_fields = ["declared", "attention", "profiles__engine", "profiles__gpu_class__name"]
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    save_service = staticmethod(services.model_save)
    delete_service = staticmethod(services.model_delete)

    def get_queryset(self) -> Any:
        # A list loads each model's profiles as a plain list (to_attr, read by the profiles' list
        # serializer): Django made a queryset for each model's prefetched profiles.
        if self.action != "list":
            return super().get_queryset()
        profiles = Profile.objects.select_related("gpu_class")
        return ServedModel.objects.prefetch_related(
            Prefetch("profiles", queryset=profiles, to_attr="profile_list")
        )


@_crud_schema("profile")
class ProfileViewSet(ServiceViewSet):
    """How each model is served: engine, GPU class, cards, arguments, environment (secret values
    write-only) and the revision replicas compare against. Filter with ``?engine=``, ``?model__name=``
    or ``?gpu_class__name=``. Every write is checked against the launch policy.
    """

    required_permission: Rule = model_permissions(Profile)
    queryset = Profile.objects.select_related("model", "gpu_class")
    kept_areas = ("structure",)  # nothing of the replicas
    kept_rows = True
    serializer_class = s.ProfileSerializer
    filterset_fields = ["engine", "model__name", "gpu_class__name"]
    save_service = staticmethod(services.profile_save)
    delete_service = staticmethod(services.profile_delete)


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": 2**63 - 1})
class IdFilter(django_filters.Filter):
    """An object's id, a whole number from 1: one no object has matches nothing (an empty page), as
    any filter value that matches nothing does, rather than a 400 "not one of the available choices"."""

    field_class = forms.IntegerField

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(min_value=1, max_value=2**63 - 1, **kwargs)


class ReplicaFilter(django_filters.FilterSet):
    profile = IdFilter(field_name="profile_id", help_text="The profile's id.")
    model = django_filters.CharFilter(field_name="profile__model__name", help_text="The model's name.")
    # The ORM path the list was first filtered by, still read; no longer offered (``model`` says it).
    unlisted = frozenset({"profile__model__name"})

    class Meta:
        model = Replica
        fields = ["state", "model", "profile__model__name", "profile"]


@_crud_schema("replica")
class ReplicaViewSet(ServiceViewSet):
    """Running instances of a profile: their cards, port, state and the profile revision each runs.
    Filter with ``?state=``, ``?model=`` (its name) or ``?profile=`` (its id). Restarts, not these
    writes, are how replicas move: see ``/api/models/{name}/restart/``.
    """

    required_permission: Rule = model_permissions(Replica)
    queryset = Replica.objects.select_related("profile__model").prefetch_related(
        Prefetch("shards", queryset=Shard.objects.select_related("card__node"))
    )
    # Not kept_rows: a replica's row serializes in less time than its loaded values take to hash.
    serializer_class = s.ReplicaSerializer
    filterset_class = ReplicaFilter
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    save_service = staticmethod(services.replica_save)
    delete_service = staticmethod(services.replica_delete)

    def get_queryset(self) -> Any:
        # A list reads only what its rows show: every column of a page's replicas, profiles, models, cards
        # and nodes (two JSON documents a replica, a node's facts) built as objects was most of its
        # first answer after a write. A column read that is not loaded costs a query, and its row is not
        # kept (base/api/cached.py).
        if self.action != "list":
            return super().get_queryset()
        shards = Shard.objects.select_related("card__node").only("replica", "card__index", "card__node__name")
        return (
            Replica.objects.select_related("profile__model")
            .only(*_REPLICA_ROW, "profile__revision", "profile__model__name")
            .prefetch_related(Prefetch("shards", queryset=shards, to_attr="shard_list"))
        )


# A replica's columns its list shows (ReplicaSerializer's fields).
_REPLICA_ROW = ("name", "profile", "port", "state", "revision", "engine_version")
