"""The filtered audit log as CSV or JSON Lines, streamed: constant memory whatever its size.

Rows come from a server-side cursor (``iterator``) in chunks and leave as
they are written; nothing holds the whole log. A CSV cell that a spreadsheet
would run as a formula (it begins with ``= + - @``) is prefixed with ``'``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import Any

from django.db.models import QuerySet
from django.http import StreamingHttpResponse

from audit.models import AuditEntry
from audit.summary import summarize
from audit.words import action_label, object_type_label, via_label

COLUMNS = [
    "id",
    "at",
    "actor",
    "via",
    "action",
    "object_type",
    "object_key",
    "object_repr",
    "summary",
    "message",
    "request_id",
    "before",
    "after",
    "prev_hash",
    "hash",
]
KINDS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}
CHUNK = 2000


def row(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.pk,
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "via": entry.via,
        "action": entry.action,
        "object_type": entry.object_type,
        "object_key": entry.object_key,
        "object_repr": entry.object_repr,
        "summary": summarize(entry),
        "message": entry.message,
        "request_id": entry.request_id,
        "before": entry.before,
        "after": entry.after,
        "prev_hash": entry.prev_hash,
        "hash": entry.hash,
    }


class _Line:
    """A file-like that hands back what csv.writer wrote, one row at a time."""

    def write(self, value: str) -> str:
        return value


def _cell(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    if value is None:
        text = ""
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def csv_lines(qs: QuerySet[AuditEntry]) -> Iterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow(COLUMNS)
    for entry in qs.iterator(chunk_size=CHUNK):
        values = row(entry)
        # A spreadsheet is read by people: the path, the action and the kind of object in the pages'
        # words ("command", not "cli"; "restart asked", not "restart_start"); JSON Lines, read by
        # programs, keeps the stored codes as the API does (docs/design.md, "Glossary").
        values["via"] = via_label(values["via"])
        values["action"] = action_label(values["action"])
        values["object_type"] = object_type_label(values["object_type"])
        yield writer.writerow([_cell(values[c]) for c in COLUMNS])


def jsonl_lines(qs: QuerySet[AuditEntry]) -> Iterator[str]:
    for entry in qs.iterator(chunk_size=CHUNK):
        yield json.dumps(row(entry), sort_keys=True, default=str) + "\n"


def export_response(qs: QuerySet[AuditEntry], kind: str) -> StreamingHttpResponse:
    """``qs`` oldest first as ``kind`` (csv or jsonl), streamed as an attachment."""
    ordered = qs.order_by("id")
    lines = csv_lines(ordered) if kind == "csv" else jsonl_lines(ordered)
    response = StreamingHttpResponse(lines, content_type=KINDS[kind])
    response["Content-Disposition"] = f'attachment; filename="audit.{kind}"'
    return response
