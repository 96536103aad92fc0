"""What every page view shares: partial or whole page, and the permission gate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django.utils.safestring import SafeString

from versions.cache import remembered

RESIZE = "catalog.resize_model"
RESTART = "catalog.restart_model"
VIEW_MODEL = "catalog.view_servedmodel"
VIEW_NODE = "catalog.view_node"
VIEW_REPLICA = "catalog.view_replica"
VIEW_OPERATION = "operations.view_restartoperation"


def wants_partial(request: HttpRequest) -> bool:
    """An htmx request for a fragment; not a history restore, which needs the whole page."""
    htmx = getattr(request, "htmx", None)
    return htmx is not None and bool(htmx) and not htmx.history_restore_request and not htmx.boosted


def render_page(
    request: HttpRequest,
    template: str,
    context: Mapping[str, Any],
    *,
    partial: str | None = None,
    status: int = 200,
) -> HttpResponse:
    """``template`` whole, or only its ``partial`` for an htmx request.

    Varies on HX-Request so that a cache never answers a full load with a fragment.
    """
    name = f"{template}#{partial}" if partial and wants_partial(request) else template
    response = render(request, name, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


def redirect_or_location(request: HttpRequest, url: str) -> HttpResponse:
    """Where to go after a change: htmx follows ``HX-Location`` (no reload); a plain form, a 303."""
    if getattr(request, "htmx", None):
        response = HttpResponse(status=204)
        response["HX-Location"] = url
        return response
    response = HttpResponse(status=303)
    response["Location"] = url
    return response


def normalized(query: QueryDict) -> QueryDict:
    """The query with its keys in order (each key's values as given): ``?b=1&a=2`` is ``?a=2&b=1``,
    one key for a kept answer, and the links drawn from it the same."""
    out = QueryDict(mutable=True)
    for key in sorted(query):
        out.setlist(key, query.getlist(key))
    out._mutable = False
    return out


def fragment(html: str) -> HttpResponse:
    """An htmx request's fragment, already drawn (a kept answer): varies on HX-Request as
    ``render_page`` does."""
    response = HttpResponse(html)
    patch_vary_headers(response, ("HX-Request",))
    return response


def kept_filters(
    request: HttpRequest, template: str, query: QueryDict, form: Callable[[Any], Any]
) -> SafeString:
    """A list page's filter form, drawn with the query's values (``template``'s ``filters`` partial)
    and kept under the catalog's version, which its choices come from: drawing its widgets was a
    quarter of a kept page's time. A GET form: no CSRF token in it."""
    return remembered(
        f"filters:{template}",
        ["structure"],
        [query.urlencode()],
        lambda: render_to_string(f"{template}#filters", {"form": form(query or None)}),
        request=request,
    )
