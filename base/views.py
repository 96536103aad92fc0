"""What every page view shares: partial or whole page, and the permission gate."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from versions.cache import drawn_from, key_of, remembered

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
    request: HttpRequest,
    template: str,
    query: QueryDict,
    form: Callable[[Any], Any],
    *,
    areas: Iterable[str] = ("structure",),
) -> SafeString:
    """A list page's filter form, drawn with the query's values (``template``'s ``filters`` partial)
    and kept under the versions of the ``areas`` its choices come from (by default the catalog's):
    drawing its widgets was a quarter of a kept page's time. After a write to them the form is made
    again (its choices' queries) but drawn again only if its choices changed (``drawn_from``): a
    model's source edited leaves the engines and the classes offered as they were. A GET form: no
    CSRF token in it."""

    def draw() -> SafeString:
        bound = form(query or None)
        choices = [(name, list(getattr(field, "choices", ()))) for name, field in bound.fields.items()]
        drawn = drawn_from(
            f"filters:{template}",
            (query.urlencode(), choices),
            lambda: render_to_string(f"{template}#filters", {"form": bound}),
        )
        return mark_safe(drawn)  # noqa: S308 - the template's drawing, escaped there

    return remembered(f"filters:{template}", areas, [query.urlencode()], draw, request=request)


# -- parts of a page that poll themselves (docs/design.md, "Pages that stay true") -------------------

SHOWN_HEADER = "X-Llmgw-Shown"  # the stamp of what the polling part shows now


def stamp_of(name: str, areas: Iterable[str], parts: Iterable[Any], *, request: HttpRequest) -> str:
    """A short stamp of a kept part's key (its areas' versions and what else it depends on): the
    same stamp, the same part. The versions are the request's one read of them."""
    return hashlib.sha256(key_of(name, areas, parts, request=request).encode()).hexdigest()[:20]


def poll_attributes(url: str, stamp: str) -> SafeString:
    """The attributes that make an element ask ``url`` for itself again every
    LLMGW_PAGE_POLL_SECONDS and swap in the answer, sending the stamp of what it shows."""
    return format_html(
        ' hx-get="{}" hx-trigger="every {}s" hx-swap="outerHTML" hx-headers="{}" data-polling="{}"',
        url,
        settings.LLMGW_PAGE_POLL_SECONDS,
        json.dumps({SHOWN_HEADER: stamp}),
        settings.LLMGW_PAGE_POLL_SECONDS,
    )


def polled_part(request: HttpRequest) -> str:
    """The id of the element an htmx request will swap (its ``HX-Target``), or "" for a page."""
    if not wants_partial(request):
        return ""
    return request.headers.get("HX-Target") or ""


def still_shown(request: HttpRequest, stamp: str) -> bool:
    """The polling part already shows this: the view answers ``unchanged()`` (htmx swaps nothing)."""
    return wants_partial(request) and request.headers.get(SHOWN_HEADER) == stamp


def unchanged() -> HttpResponse:
    """What a poll of a part that has not changed gets: no body, and htmx leaves the page alone."""
    response = HttpResponse(status=204)
    patch_vary_headers(response, ("HX-Request",))
    return response
