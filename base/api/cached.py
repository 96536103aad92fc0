"""List endpoints whose answers are kept under the fleet's versions (versions/cache.py).

The DRF view has signed the caller in, checked the permission and the throttles before ``list``
runs; the kept answer is the serialized page for the query (normalised), the host it was asked
at (the pages' links are absolute) and the format asked for, rendered per request.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rest_framework.request import Request
from rest_framework.response import Response

from base.views import normalized
from versions.cache import remembered


class KeptList:
    """A mixin for a viewset: ``list`` kept under ``kept_areas``' versions."""

    kept_areas: ClassVar[tuple[str, ...]] = ("structure", "placement", "replicas")

    def keep(self, data: Any) -> bool:
        """Whether an answer may be kept: False for one the clock changes, not only a write."""
        return True

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        parts = [
            request.scheme,
            request.get_host(),
            request.path,
            normalized(request.query_params).urlencode(),
            getattr(request.accepted_renderer, "format", ""),
        ]
        data = remembered(
            f"api-{type(self).__name__}",
            self.kept_areas,
            parts,
            lambda: super(KeptList, self).list(request, *args, **kwargs).data,  # type: ignore[misc]
            request=request._request,
            keep=self.keep,
        )
        return Response(data)
