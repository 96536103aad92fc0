"""A profile's revisions and its rollback over the API: the service's, translated."""

from __future__ import annotations

from dataclasses import asdict

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from base.api.inputs import StrictInput, StrictIntegerField
from base.errors import not_found
from base.rules import Rule
from catalog.api.serializers import ErrorSerializer
from catalog.models import Profile
from operations.api.resize import RankPlaceSerializer
from operations.services.rollback import profile_rollback, revisions


class RollbackInput(StrictInput):
    profile = serializers.CharField(help_text="The profile to roll back.")
    revision = StrictIntegerField(
        bounds=(1, 2**31 - 1), help_text="The revision whose settings it is to run again."
    )
    dry_run = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Run every check and plan it all (adopted, restarted and where), save nothing.",
    )


class AdoptedSerializer(serializers.Serializer):
    replica = serializers.CharField()
    runs = serializers.IntegerField(help_text="The revision it ran, whose settings are the restored ones.")


class RestartedSerializer(serializers.Serializer):
    replica = serializers.CharField()
    runs = serializers.IntegerField(help_text="The revision it runs.")
    why = serializers.CharField(help_text="Why it cannot take the new revision without a restart.")
    node = serializers.CharField(help_text="Where the restart's plan puts its replacement.")
    cards = serializers.ListField(child=serializers.IntegerField())
    in_place = serializers.BooleanField(
        allow_null=True, help_text="Stopped before its replacement starts (true), or beside it (false)."
    )
    ranks = RankPlaceSerializer(
        many=True,
        help_text="A replica across nodes: where the plan puts each rank; empty on one node (node and "
        "cards say it, rank 0's of a group).",
    )


class RollbackSerializer(serializers.Serializer):
    profile = serializers.CharField()
    from_revision = serializers.IntegerField(help_text="The revision it was at.")
    to_revision = serializers.IntegerField(help_text="The revision whose settings it runs again.")
    new_revision = serializers.IntegerField(help_text="The revision it is at now (a new one).")
    operation = serializers.IntegerField(
        allow_null=True, help_text="The restart started for the replicas in restarted (none on a dry run)."
    )
    adopted = AdoptedSerializer(
        many=True, help_text="Replicas that run the restored settings already: current without a restart."
    )
    restarted = RestartedSerializer(many=True, help_text="Replicas the restart takes onto the new revision.")


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
    required_permission: Rule = "catalog.resize_model"

    @extend_schema(
        request=RollbackInput,
        responses={
            200: RollbackSerializer,
            400: OpenApiResponse(ErrorSerializer),
            403: OpenApiResponse(ErrorSerializer),
            404: OpenApiResponse(ErrorSerializer),
            409: OpenApiResponse(
                ErrorSerializer, description="Refused: declared, busy, unchanged, no room, secret_unknown"
            ),
        },
        summary="Roll a profile back to a revision: a new revision with its settings; the replicas that "
        "run them already adopt it, the others are restarted",
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
                    "adopted": [asdict(a) for a in done.adopted],
                    "restarted": [
                        {
                            **asdict(r),
                            "ranks": [{"rank": k, "node": n, "cards": list(c)} for k, n, c in r.ranks],
                        }
                        for r in done.restarted
                    ],
                }
            ).data
        )


class RevisionsView(APIView):
    required_permission: Rule = "catalog.view_profile"

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
