"""A profile's revisions and its rollback over the API: the service's, translated."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from catalog.api.inputs import StrictInput, StrictIntegerField
from catalog.api.permissions import CanResize
from catalog.api.serializers import ErrorSerializer
from catalog.errors import not_found
from catalog.models import Profile
from catalog.services.rollback import profile_rollback, revisions


class RollbackInput(StrictInput):
    profile = serializers.CharField(help_text="The profile to roll back.")
    revision = StrictIntegerField(help_text="The revision whose settings it is to run again.")
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="Run every check, save nothing."
    )


class RollbackSerializer(serializers.Serializer):
    profile = serializers.CharField()
    from_revision = serializers.IntegerField(help_text="The revision it was at.")
    to_revision = serializers.IntegerField(help_text="The revision whose settings it runs again.")
    new_revision = serializers.IntegerField(help_text="The revision it is at now (a new one).")
    operation = serializers.IntegerField(
        allow_null=True, help_text="The restart started for its stale replicas."
    )


class RevisionSerializer(serializers.Serializer):
    revision = serializers.IntegerField()
    at = serializers.DateTimeField()
    actor = serializers.CharField()
    via = serializers.CharField()
    entry = serializers.IntegerField(help_text="The audit entry that recorded it (GET /api/audit/?...).")
    settings = serializers.DictField(
        help_text="What it runs: engine, GPU class, spread, arguments, environment."
    )


class RollbackView(APIView):
    permission_classes = [CanResize]

    @extend_schema(
        request=RollbackInput,
        responses={
            200: RollbackSerializer,
            400: OpenApiResponse(ErrorSerializer),
            403: OpenApiResponse(ErrorSerializer),
            404: OpenApiResponse(ErrorSerializer),
            409: OpenApiResponse(ErrorSerializer, description="Refused: declared, busy, unchanged, no room"),
        },
        summary="Roll a profile back to a revision: a new revision with its settings, then a restart",
    )
    def post(self, request: Request, name: str) -> Response:
        data = RollbackInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        done = profile_rollback(
            model=name, profile=v["profile"], revision=v["revision"], dry_run=v["dry_run"]
        )
        return Response(
            RollbackSerializer(
                {
                    "profile": str(done.profile),
                    "from_revision": done.from_revision,
                    "to_revision": done.to_revision,
                    "new_revision": done.new_revision,
                    "operation": done.operation,
                }
            ).data
        )


class RevisionsView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(
        responses={200: RevisionSerializer(many=True)}, summary="A profile's revisions, newest first"
    )
    def get(self, request: Request, name: str, profile: str) -> Response:
        found = Profile.objects.select_related("model").filter(model__name=name, name=profile).first()
        if found is None:
            raise not_found(f"{name} has no profile {profile!r}.")
        rows = [
            {
                "revision": r.number,
                "at": r.entry.at,
                "actor": r.entry.actor,
                "via": r.entry.via,
                "entry": r.entry.pk,
                "settings": r.settings,
            }
            for r in revisions(found)
        ]
        return Response(RevisionSerializer(rows, many=True).data)
