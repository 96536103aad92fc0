"""Engine releases over the API: the fleet's defaults and the release watch's last answer, an
upgrade's dry run and its application, and pinning a profile's KV pool."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from base.api.inputs import StrictInput
from base.rules import Rule
from catalog.selectors import engine_defaults
from operations.services.kv_pin import kv_pin
from operations.services.release_watch import latest_check
from operations.services.upgrade import upgrade_apply, upgrade_what_if


class ReleaseCheckEntrySerializer(serializers.Serializer):
    engine = serializers.CharField()
    package = serializers.CharField(
        allow_blank=True, help_text="Its package on the index; empty: not watched."
    )
    default = serializers.CharField(
        allow_blank=True, help_text="The fleet's default release; empty: none set."
    )
    newest = serializers.CharField(allow_blank=True, help_text="The index's newest final release.")
    newer = serializers.BooleanField()
    error = serializers.CharField(allow_blank=True, help_text="Why the index did not say, if it did not.")


class ReleaseCheckSerializer(serializers.Serializer):
    checked_at = serializers.DateTimeField()
    index_url = serializers.CharField()
    results = ReleaseCheckEntrySerializer(many=True)


class ReleasesSerializer(serializers.Serializer):
    defaults = serializers.DictField(
        child=serializers.CharField(), help_text="Engine to its default release."
    )
    check = ReleaseCheckSerializer(allow_null=True, help_text="The release watch's last answer.")


class ReleasesView(APIView):
    required_permission: Rule = "catalog.view_profile"

    @extend_schema(operation_id="releases", responses={200: ReleasesSerializer}, summary="Engine releases")
    def get(self, request: Request) -> Response:
        check = latest_check()
        return Response(
            {
                "defaults": engine_defaults(),
                "check": ReleaseCheckSerializer(check).data if check is not None else None,
            }
        )


RELEASE_PATTERN = r"^[vb]?\d{1,9}(\.\d{1,9}){0,5}((a|b|rc|dev)\d{0,9})?(\.post\d{0,9})?$"


class UpgradeInput(StrictInput):
    engine = serializers.CharField(help_text="The engine, as the registry names it.")
    release = serializers.RegexField(
        RELEASE_PATTERN,
        max_length=64,
        help_text="The release to move to, as the engine numbers it: 0.19.1, b6500.",
    )
    profile = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="model/profile: that profile's release; empty: the fleet's default of the engine.",
    )
    dry_run = serializers.BooleanField(
        required=False,
        default=True,
        help_text="Re-plan, save nothing (the default: the dry run comes first).",
    )

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        from planning import engines  # the registry is data; loaded once

        known = sorted(engines.registry())
        fields["engine"] = serializers.ChoiceField(
            choices=known,
            help_text="The engine, as the registry names it.",
            error_messages={
                "invalid_choice": f"There is no engine {{input!r}}; the registry knows {', '.join(known)}."
            },
        )
        return fields


class NodeLackingSerializer(serializers.Serializer):
    node = serializers.CharField()
    code = serializers.CharField(help_text="capability, driver, cuda, arch or release_missing.")
    reason = serializers.CharField()


class ProfileUpgradeSerializer(serializers.Serializer):
    model = serializers.CharField()
    profile = serializers.CharField()
    release_before = serializers.CharField(allow_blank=True)
    release_after = serializers.CharField()
    gpu_class = serializers.CharField(allow_blank=True)
    live_replicas = serializers.IntegerField()
    kv_tokens_before = serializers.IntegerField(allow_null=True, help_text="KV tokens a card before.")
    kv_tokens_after = serializers.IntegerField(allow_null=True, help_text="KV tokens a card after.")
    need_before = serializers.IntegerField(allow_null=True)
    need_after = serializers.IntegerField(allow_null=True)
    budget = serializers.IntegerField(allow_null=True)
    fits_after = serializers.BooleanField(allow_null=True)
    stops_fitting = serializers.BooleanField(help_text="It would no longer run on the new release.")
    refusal = serializers.CharField(allow_blank=True)
    nodes_lacking = NodeLackingSerializer(many=True)
    nodes_unknown = serializers.ListField(child=serializers.CharField())


class UpgradeSerializer(serializers.Serializer):
    engine = serializers.CharField()
    release = serializers.CharField()
    scope = serializers.ChoiceField(choices=["default", "profile"])
    before = serializers.CharField(allow_blank=True)
    memory_terms_before = serializers.CharField()
    memory_terms_after = serializers.CharField()
    profiles = ProfileUpgradeSerializer(many=True)
    stop_fitting = serializers.ListField(child=serializers.CharField())
    nodes_lacking = serializers.ListField(child=serializers.CharField())
    note = serializers.CharField(allow_blank=True)
    applied = serializers.BooleanField()
    operations = serializers.ListField(child=serializers.IntegerField(), help_text="Restarts started.")


class UpgradeView(APIView):
    required_permission: Rule = "catalog.restart_model"

    @extend_schema(
        operation_id="releases_upgrade",
        request=UpgradeInput,
        responses={
            200: UpgradeSerializer,
            400: OpenApiResponse(description="invalid, unknown_engine, unchanged"),
            404: OpenApiResponse(description="not_found"),
            409: OpenApiResponse(description="upgrade_does_not_fit, busy"),
        },
        summary="Upgrade an engine's release: the dry run, or the change",
    )
    def post(self, request: Request) -> Response:
        data = UpgradeInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        kw = {"engine_name": v["engine"], "release": v["release"], "profile": v["profile"] or None}
        plan = upgrade_what_if(**kw) if v["dry_run"] else upgrade_apply(**kw)
        return Response(plan.as_dict())


class KvPinInput(StrictInput):
    dry_run = serializers.BooleanField(required=False, default=True, help_text="Say the pin; save nothing.")


class KvPinSerializer(serializers.Serializer):
    model = serializers.CharField()
    profile = serializers.CharField()
    flag = serializers.CharField()
    kv_bytes = serializers.IntegerField(help_text="The KV pool a card, bytes: the smallest measured.")
    measured_on = serializers.ListField(child=serializers.CharField(), help_text="The replicas measured.")
    args_before = serializers.ListField(child=serializers.CharField())
    args_after = serializers.ListField(child=serializers.CharField())
    applied = serializers.BooleanField()
    revision = serializers.IntegerField(allow_null=True)


class KvPinView(APIView):
    required_permission: Rule = "catalog.change_profile"

    @extend_schema(
        operation_id="profiles_pin_kv",
        request=KvPinInput,
        responses={
            200: KvPinSerializer,
            400: OpenApiResponse(description="not_pinnable, unchanged, refused_arg, memory"),
            404: OpenApiResponse(description="not_found"),
            409: OpenApiResponse(description="not_measured, busy"),
        },
        summary="Pin a profile's KV pool to what its replicas measured",
    )
    def post(self, request: Request, name: str, profile: str) -> Response:
        data = KvPinInput(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(kv_pin(model=name, profile=profile, dry_run=data.validated_data["dry_run"]).as_dict())
