"""Reading the audit log: the filters every reader shares, keyset pages, groups and histories.

The page, the API and both exports filter through ``entries_matching``, so a
filter means the same everywhere. Pages are keyset pages on the id (newest
first), never offsets: each is one index range scan, so the last page of a
million entries costs what the first does (the indexes are the model's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from audit.models import AuditEntry, OutsideChange, RowChange

FILTERS = ("who", "object_type", "object", "action", "via", "since", "until", "request_id", "operation")


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def operation_q(operation_id: int) -> Q:
    """An operation's entries: the restart's own (by its id) and every one its worker wrote (their
    request id is ``restart-<id>``), with the change that asked for it (the same request id)."""
    own = Q(object_type="restart", object_key=str(operation_id))
    asked = (
        AuditEntry.objects.filter(own, action="restart_start").values_list("request_id", flat=True).first()
    )
    q = own | Q(request_id=f"restart-{operation_id}")
    if asked:
        q |= Q(request_id=asked)
    return q


def entries_matching(filters: Mapping[str, Any]) -> QuerySet[AuditEntry]:
    """The entries the filters let through, newest first; an empty or missing filter lets all through.

    ``filters`` are cleaned values (``AuditFilterForm.cleaned_data``): ``who`` the actor's name,
    ``object_type`` and ``object`` (its name: the key, exactly), ``action``, ``via``, ``since`` and
    ``until`` (dates, both days included), ``request_id``, ``operation`` (a restart's id)."""
    qs = AuditEntry.objects.all()
    if who := filters.get("who"):
        qs = qs.filter(actor=who)
    if object_type := filters.get("object_type"):
        qs = qs.filter(object_type=object_type)
    if name := filters.get("object"):
        qs = qs.filter(object_key=name)
    if action := filters.get("action"):
        qs = qs.filter(action=action)
    if via := filters.get("via"):
        qs = qs.filter(via=via)
    if since := filters.get("since"):
        qs = qs.filter(at__gte=_start_of(since))
    if until := filters.get("until"):
        qs = qs.filter(at__lt=_start_of(until + timedelta(days=1)))
    if request_id := filters.get("request_id"):
        qs = qs.filter(request_id=request_id)
    if operation := filters.get("operation"):
        qs = qs.filter(operation_q(operation))
    return qs.order_by("-id")


@dataclass(frozen=True)
class KeysetPage:
    """One page of entries, newest first, and the ids the links to the pages beside it carry."""

    entries: list[Any]  # audit entries, or row changes
    newer: int | None  # ?after=<newer> shows the page of newer entries
    older: int | None  # ?before=<older> shows the page of older entries

    @property
    def has_other_pages(self) -> bool:
        return self.newer is not None or self.older is not None


def keyset_page(
    qs: QuerySet[Any], *, before: int | None = None, after: int | None = None, size: int = 50
) -> KeysetPage:
    """The page of ``size`` entries older than ``before``, or newer than ``after`` (``after=0``: the
    oldest page), or the newest page. Each is one range scan on the primary key, whatever the page's
    depth."""
    base = qs.order_by()
    if after is not None:
        entries = list(base.filter(pk__gt=after).order_by("pk")[:size])
        entries.reverse()
    elif before is not None:
        entries = list(base.filter(pk__lt=before).order_by("-pk")[:size])
    else:
        entries = list(base.order_by("-pk")[:size])
    if not entries:
        return KeysetPage([], None, None)
    newest, oldest = entries[0].pk, entries[-1].pk
    has_newer = base.filter(pk__gt=newest).exists()
    has_older = base.filter(pk__lt=oldest).exists()
    return KeysetPage(entries, newest if has_newer else None, oldest if has_older else None)


def history(q: Q, *, limit: int = 10) -> list[AuditEntry]:
    """The newest ``limit`` entries matching ``q``, for a page's history panel."""
    return list(AuditEntry.objects.filter(q).order_by("-id")[:limit])


def model_history_q(name: str) -> Q:
    """A model's entries and its profiles' (their keys are ``<model>/<profile>``)."""
    return Q(object_type="model", object_key=name) | Q(
        object_type="profile", object_key__startswith=f"{name}/"
    )


def entries_of_request(request_id: str) -> QuerySet[AuditEntry]:
    return AuditEntry.objects.filter(request_id=request_id).order_by("id")


def node_history_q(name: str) -> Q:
    """A node's entries and its cards' (their keys are ``<node>#<index>``)."""
    return Q(object_type="node", object_key=name) | Q(object_type="card", object_key__startswith=f"{name}#")


def changed_outside() -> QuerySet[RowChange]:
    """Catalog row changes whose transaction wrote no audit entry: made outside the application, newest
    first. PostgreSQL's triggers record them as each transaction commits (``OutsideChange``,
    audit/migrations/0007); elsewhere nothing is recorded and this is empty. To list a page of them, or
    count them, ``outside_page`` and ``outside_count`` read only the recorded ids."""
    return RowChange.objects.filter(pk__in=OutsideChange.objects.values("change_id")).order_by("-id")


def outside_count() -> int:
    return OutsideChange.objects.count()


def outside_page(*, before: int | None = None, after: int | None = None, size: int = 50) -> KeysetPage:
    """A keyset page of ``changed_outside()``, newest first: the page's ids are a range scan of the
    recorded ids alone, then those row changes are read by their ids. (Joined in one query, the planner
    walks the million row changes from the newest down to the first recorded one.)"""
    ids = keyset_page(OutsideChange.objects.all(), before=before, after=after, size=size)
    changes = RowChange.objects.in_bulk([o.pk for o in ids.entries])
    return KeysetPage([changes[o.pk] for o in ids.entries], ids.newer, ids.older)
