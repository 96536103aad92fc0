"""A replica: where it runs, and what its cards were planned to hold beside
what its engine and card reported."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET

from access.rules import requires
from catalog.models import Replica
from catalog.planning.measured import compare, drift
from catalog.planning.units import gib
from catalog.services.fit import profile_memory
from catalog.views.common import VIEW_REPLICA, render_page
from catalog.views.display import hue


def planned_of(replica: Replica) -> tuple[dict[str, Any], str]:
    """What the replica's cards were planned to hold, and where the figure is from."""
    if replica.planned_memory:
        return dict(replica.planned_memory), "planned when it started"
    if replica.revision == replica.profile.revision:
        memory = profile_memory(replica.profile, replica.profile.model)
        if memory is not None:
            return memory.as_dict(), "its profile as planned now (it runs the current revision)"
    return {}, "not kept: it runs an older revision of its profile"


def _fmt(n: int | None, term: str) -> str:
    if n is None:
        return "—"
    return f"{n:,}" if term == "kv_tokens" else f"{gib(n, 2)} GiB"


@requires(VIEW_REPLICA)
@require_GET
def replica_detail(request: HttpRequest, name: str) -> HttpResponse:
    replica = get_object_or_404(
        Replica.objects.select_related("profile__model", "profile__gpu_class"), name=name
    )
    planned, planned_from = planned_of(replica)
    rows = [
        {
            "label": r.label,
            "planned": _fmt(r.planned, r.term),
            "measured": _fmt(r.measured, r.term),
            "difference": f"{r.difference:+.1%}" if r.difference is not None else "—",
            "term": r.term,
        }
        for r in compare(planned, replica.measured_memory)
    ]
    others = Replica.objects.select_related("profile").exclude(measured_memory={}).exclude(planned_memory={})
    engines = drift((r.profile.engine, r.planned_memory, r.measured_memory) for r in others)
    placement: dict[str, list[int]] = {}
    for s in replica.shards.select_related("card__node").order_by("card__node__name", "card__index"):
        placement.setdefault(s.card.node.name, []).append(s.card.index)
    return render_page(
        request,
        "catalog/replica_detail.html",
        {
            "section": "models",
            "replica": replica,
            "model": replica.profile.model,
            "hue": hue(replica.profile.model_id),
            "placement": list(placement.items()),
            "rows": rows,
            "planned_from": planned_from,
            "measured": bool(replica.measured_memory),
            "drift": [
                {"engine": e, "mean": f"{mean:+.1%}", "count": count} for e, (mean, count) in engines.items()
            ],
        },
    )
