"""Who the caller is signed in as: the least a signed-in API request can do.

It answers from the session or token alone (no catalog query), so automation
can check its credentials cheaply, and ``make bench`` measures every page
against it: the floor of a request through the whole middleware, the
authentication and DRF, with nothing of the fleet in it.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from base.actor import current_actor
from base.rules import SIGNED_IN, Rule


class WhoAmIView(APIView):
    required_permission: Rule = SIGNED_IN

    @extend_schema(
        summary="The signed-in user and this request's id",
        responses=inline_serializer(
            "WhoAmI", {"username": serializers.CharField(), "request_id": serializers.CharField()}
        ),
    )
    def get(self, request: Request) -> Response:
        return Response({"username": request.user.get_username(), "request_id": current_actor().request_id})
