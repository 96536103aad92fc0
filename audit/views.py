"""The leads' pages: the audit list with its filters, an entry, and the exports.

Reading needs ``audit.view_auditentry``, exporting ``audit.export_auditentry``;
both are checked here on the server, whatever the page showed.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from audit.export import KINDS, export_response
from audit.forms import AuditFilterForm
from audit.models import AuditEntry
from audit.selectors import entries_matching, entries_of_request, keyset_page, outside_page
from audit.summary import change_rows, diff_rows, summarize
from base.rules import requires
from versions.cache import remembered

VIEW = "audit.view_auditentry"
EXPORT = "audit.export_auditentry"
PAGE_SIZE = 50


def _int(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number >= 0 else None


def filter_query(form: AuditFilterForm) -> str:
    """The filters as a query string, for the pager's and the exports' links."""
    if not form.is_valid():
        return ""
    return urlencode({k: str(v) for k, v in form.cleaned_data.items() if v not in (None, "")})


@requires(VIEW)
@require_GET
def entry_list(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    context: dict[str, Any] = {
        "section": "audit",
        "form": form,
        "can_export": request.user.has_perm(EXPORT),
    }
    if not form.is_valid():
        context.update(page=None, error=form.errors_sentence(), query="")
        return render(request, "audit/entry_list.html", context, status=400)
    query = filter_query(form)
    before, after = _int(request.GET.get("before")), _int(request.GET.get("after"))

    def results() -> dict[str, Any]:
        page = keyset_page(entries_matching(form.cleaned_data), before=before, after=after, size=PAGE_SIZE)
        found = {"page": page, "rows": [(e, summarize(e)) for e in page.entries], "query": query}
        return {**found, "results_html": render_to_string("audit/entry_list.html#results", found)}

    # The results read only the log and hold nothing of the reader's: kept under the log's version
    # (versions/cache.py; every entry appended raises it), keyed on the filters and the page's
    # bounds; the form, the export links and the page around them are drawn anew.
    context.update(remembered("audit-list", ["audit"], [query, before, after], results, request=request))
    return render(request, "audit/entry_list.html", context)


@requires(VIEW)
@require_GET
def entry_detail(request: HttpRequest, pk: int) -> HttpResponse:
    entry = get_object_or_404(AuditEntry, pk=pk)
    together = list(entries_of_request(entry.request_id)[:200]) if entry.request_id else [entry]
    every = diff_rows(entry.before, entry.after)
    return render(
        request,
        "audit/entry_detail.html",
        {
            "section": "audit",
            "entry": entry,
            "summary": summarize(entry),
            # An update's changed fields; the rest folded away below them.
            "rows": [r for r in every if r.changed or entry.before is None or entry.after is None],
            "unchanged": [
                r for r in every if not r.changed and entry.before is not None and entry.after is not None
            ],
            "together": [(e, summarize(e)) for e in together],
            "operation": entry.request_id.removeprefix("restart-")
            if entry.request_id.startswith("restart-")
            else (entry.object_key if entry.object_type == "restart" else ""),
        },
    )


@requires(VIEW)
@require_GET
def outside_list(request: HttpRequest) -> HttpResponse:
    """Catalog rows changed with no audit entry in their transaction: by SQL, behind the application."""
    page = outside_page(
        before=_int(request.GET.get("before")), after=_int(request.GET.get("after")), size=PAGE_SIZE
    )
    rows = [(change, change_rows(change.before, change.after)) for change in page.entries]
    return render(
        request,
        "audit/outside_list.html",
        {"section": "audit", "page": page, "rows": rows, "recorded": connection.vendor == "postgresql"},
    )


@requires(EXPORT)
@require_GET
def entry_export(request: HttpRequest, kind: str) -> HttpResponseBase:
    if kind not in KINDS:
        return HttpResponseBadRequest(f"No export as {kind!r}: ask for csv or jsonl.")
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return HttpResponseBadRequest(
            f"The filters are wrong, nothing was exported: {form.errors_sentence()}"
        )
    return export_response(entries_matching(form.cleaned_data), kind)


def history_context(request: HttpRequest, q: Any, **filters: str) -> dict[str, Any]:
    """A page's history panel: the newest entries ``q`` matches, and the audit list filtered to them
    (``filters``). None (no panel) for a user who may not read the log."""
    from django.urls import reverse

    from audit.selectors import history

    if not request.user.has_perm(VIEW):
        return {"history": None}
    # Kept under the audit log's version (versions/cache.py): every entry written raises it.
    rows = remembered(
        "history", ["audit"], [repr(q)], lambda: [(e, summarize(e)) for e in history(q)], request=request
    )
    return {
        "history": rows,
        "history_url": reverse("audit:entry_list") + ("?" + urlencode(filters) if filters else ""),
    }
