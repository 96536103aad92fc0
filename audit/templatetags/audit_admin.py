"""The admin's audit list, its rows kept: drawing 50 entries through the admin's row machinery (a
field lookup, a formatter and an escape per cell) was most of a warm request's time."""

from __future__ import annotations

from typing import Any

from django import template
from django.contrib.admin.templatetags.admin_list import result_list
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.safestring import SafeString, mark_safe

from versions.cache import remembered

register = template.Library()


@register.simple_tag(takes_context=True)
def kept_audit_results(context: Any, cl: Any) -> SafeString:
    """The change list's table of entries (what ``{% result_list cl %}`` draws), kept under the log's
    version (an entry appended raises it; entries are never changed or deleted) and what the rows
    are drawn from: the full query (page, search, filter, ordering, popup: the rows' links carry the
    query back), the time zone and language the dates are written in. Nothing in it is the
    reader's: only who may read the list reaches it, and no action (no checkbox) is offered to
    anyone, since nobody may change or delete an entry."""
    request = context["request"]
    parts = [request.get_full_path(), timezone.get_current_timezone_name(), translation.get_language()]

    def drawn() -> str:
        return render_to_string(
            [
                f"admin/{cl.opts.app_label}/{cl.opts.model_name}/change_list_results.html",
                "admin/change_list_results.html",
            ],
            result_list(cl),
        )

    return mark_safe(remembered("admin-audit-results", ["audit"], parts, drawn, request=request))  # noqa: S308
