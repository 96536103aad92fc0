"""The nodes: a summary of the fleet, a page of nodes with their cards (free, or held by which
model), filtered; and a node's page with its replicas. Each part is kept under the versions of what
it shows and polls itself; the grid itself is drawn in ``web/node_grid.py``.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Collection
from typing import Any, NamedTuple

from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET

from audit.selectors import node_history_q
from audit.views import history_context
from base.rules import requires
from base.views import (
    RESTART,
    VIEW_NODE,
    fragment,
    kept_filters,
    normalized,
    poll_attributes,
    polled_part,
    render_page,
    stamp_of,
    still_shown,
    unchanged,
    wants_partial,
)
from catalog.models import Card, Node, Replica
from catalog.selectors import (
    CARD_ROW,
    cards_of,
    compact_cards_of,
    fleet_counts,
    fleet_summary,
    holders_of,
    nodes_matching,
)
from operations import views as operation_views
from operations.selectors import operations_with_steps
from telemetry.selectors import (
    foreign_held_card_ids,
    unreachable_node_ids,
)
from versions.cache import drawing, drawn_from, remembered
from web.forms import NodeFilterForm
from web.node_grid import (
    FILLED_AREAS,
    PLANNED_COLUMNS,
    SEEN_WITHIN_SECONDS,
    NodeRow,
    filled_parts,
    grids,
    kept_with_readings,
    legend,
    planned_of,
    rows_html,
)

# Nodes on a page: a tile per card is about 170 bytes, so 50 nodes of 8 cards stay well under 200 kB;
# a compact mark is a fifth of that.
PAGE_SIZES = {"cards": 50, "compact": 500}


class Results(NamedTuple):
    html: str  # marked where the readings go
    drawing: str  # the digest of what it was drawn from (versions.cache.drawing)
    node_ids: list[int]
    compact: bool  # drawn compact: the only reading it shows is whether a foreign process holds memory


def node_results(query: QueryDict, foreign_held: Collection[int] = (), *, request: Any = None) -> Results:
    """The nodes page's results (count, legend, the page of nodes with their cards, pager) for the
    query's filters and page, marked where the readings go, and the nodes shown: what an htmx
    filter swaps in, and the page shows. ``foreign_held``: the cards a foreign process holds, which
    the free filter does not count free (``foreign_held_for``).

    What is drawn is read first (the page of nodes, their cards with their holders, each held
    card's planned need: a few queries) and the drawing kept by what it was drawn from
    (``drawing``): a write that changes nothing shown (a model's source, a replica's state on
    another page, or in the compact view, which does not show it, a card's elsewhere) finds it
    drawn, one that changes anything shown draws it anew."""
    form = NodeFilterForm.for_fleet(query or None)
    valid = form.is_bound and form.is_valid()
    data = form.cleaned_data if valid else {}
    # The view asked, even beside a filter in error: its kept results' areas are chosen by it alone
    # (``results_areas``).
    view = (form.cleaned_data.get("view") if form.is_bound else None) or "cards"
    compact = view == "compact"
    filters = {k: v for k, v in data.items() if k != "view" and v not in (None, "")}
    matching = remembered(
        "nodes-matching",
        ["fleet", "placement", *(["models", "replicas"] if filters.get("model") else [])],
        [sorted(filters.items()), tuple(foreign_held)],
        lambda: [
            NodeRow(*n)
            for n in nodes_matching(filters, not_free=foreign_held).values_list("pk", "name", "state")
        ],
        request=request,
    )
    page = Paginator(matching, PAGE_SIZES[view]).get_page(query.get("page"))
    nodes: list[NodeRow] = list(page.object_list)
    if compact:  # nor a replica's state, read into what it is drawn from (``compact_cards_of``)
        rows = compact_cards_of([n.pk for n in nodes])
        planned: dict[str, int] = {}
    else:  # each card's replica's recorded need and profile read with it (``planned_of``)
        read = cards_of([n.pk for n in nodes], PLANNED_COLUMNS)
        rows = [r[: len(CARD_ROW)] for r in read]
        planned = planned_of(
            {r[3]: (r[3], *r[len(CARD_ROW) :]) for r in read if r[3]}.values(), request=request
        )
    rest = query.copy()
    rest.pop("page", None)
    shown = (
        rest.urlencode(),
        sorted((k, [str(e) for e in v]) for k, v in form.errors.items()),
        bool(filters),
        compact,
        page.paginator.count,
        page.number,
        page.paginator.num_pages,
        nodes,
        rows,
        sorted(planned.items()),
    )

    def draw() -> str:
        node_grids = grids(nodes, rows, compact=compact, planned=planned)
        return render_to_string(
            "catalog/node_list.html#results",
            {
                "form": form,
                "page": page,
                "grids": node_grids,
                "rows": rows_html(node_grids),
                "legend": legend(node_grids),
                "compact": compact,
                "filtered": bool(filters),
                "query": rest.urlencode(),
                "poll": POLL_MARK,
            },
        )

    digest, html = drawing("nodes-results-drawn", shown, draw)
    return Results(html, digest, [n.pk for n in nodes], compact)


def foreign_held_for(query: QueryDict) -> list[int]:
    """The cards a foreign process holds (fresh readings say so), when the free filter asks for
    them (its count leaves them out, as the grid does), by id; else none, and no query. The kept
    results are keyed on them too, so a card a foreign process takes or lets go is counted anew."""
    return sorted(foreign_held_card_ids()) if query.get("free", "").strip() else []


def results_areas(query: QueryDict) -> list[str]:
    """What the results are read from: the cards, their holders and their models (each held card's
    planned need), and the holders' states. The compact view shows no state and no need: only who
    holds each card (a holder's name, profile and rendezvous port raise the placement's version) and
    their models' names (the names' version: versions/triggers.py, ``HOLDER``, ``NAMED``), so neither
    a state flipped in a restart, every few seconds, nor a model's other edits read it again."""
    if query.get("view") == "compact":  # of the models, only their names (versions/triggers.py, ``NAMED``)
        return ["fleet", "names", "placement"]
    return ["fleet", "models", "placement", "replicas"]


# Where a kept part's polling attributes go: put in per request, with the stamp of what it shows.
POLL_MARK = "\x1eP\x1e"


def _here(query: QueryDict) -> str:
    url = reverse("node-list")
    return f"{url}?{query.urlencode()}" if query else url


def cordoned_free_by_class() -> dict[str, int]:
    """Cards cordoned on their own that no replica holds, by class: not free. One query."""
    rows = (
        Card.objects.filter(cordoned=True, shard__isnull=True)
        .values_list("gpu_class__name")
        .annotate(n=Count("id"))
        .order_by()
    )
    return dict(rows)


def foreign_held_by_class() -> dict[str, int]:
    """Cards no replica holds and not cordoned that a foreign process holds (a fresh reading says
    so), by class: held, not free. One query, two when there are some."""
    held = foreign_held_card_ids()
    if not held:
        return {}
    rows = (
        Card.objects.filter(pk__in=held, shard__isnull=True, cordoned=False)
        .values_list("gpu_class__name")
        .annotate(n=Count("id"))
        .order_by()
    )
    return dict(rows)


class SummaryReadings(NamedTuple):
    foreign: dict[str, int]  # foreign-held free cards by class
    unreachable: int  # nodes whose agent is not answering


def summary_of_fleet(
    fleet: dict[str, Any], cordoned: dict[str, int], readings: SummaryReadings
) -> dict[str, Any]:
    """The fleet's summary (catalog.selectors.fleet_summary) as the operator must read it: a card a
    foreign process holds counted held, not free, a card cordoned on its own not free, and the nodes
    whose agent is not answering counted beside the states (an unreachable node keeps its state: the
    operator's word on its use)."""
    out = copy.deepcopy(fleet)
    held = readings.foreign
    for c in out["classes"]:
        n = held.get(c["name"], 0)
        c["free"] -= n + cordoned.get(c["name"], 0)
        c["held"] += n
        c["foreign"] = n
    out["free"] -= sum(held.values()) + sum(cordoned.values())
    out["foreign"] = sum(held.values())
    out["cordoned"] = sum(cordoned.values())
    out["unreachable"] = readings.unreachable
    return out


# The summary's parts: the hardware's (cards by class and by holding profile, nodes by state, cards
# cordoned) under the fleet's and the placement's versions (a replica's profile changed in place, as a
# PATCH of /api/replicas/ may, raises the placement's: versions/triggers.py, ``HOLDER``); each
# holding profile's model, by name, under the names' (a model's or a profile's name, a profile's model:
# versions/triggers.py, ``NAMED``); its
# readings' (foreign holds, agents not answering) under the readings' (and the fleet's and
# placement's, which say which cards are free and nodes reachable); drawn under all and the clock's
# 10 s tick (a foreign process's reading stops counting as it ages past
# LLMGW_TELEMETRY_STALE_SECONDS, which no write says), and kept by what it shows (``drawn_from``).
SUMMARY_AREAS = ["fleet", "names", "placement", "readings"]


def summary_html(request: HttpRequest) -> tuple[str, SafeString]:
    """The summary's stamp and the summary drawn, polling itself (``SUMMARY_AREAS``)."""
    parts = [int(time.time() // SEEN_WITHIN_SECONDS)]
    stamp = stamp_of("nodes-summary", SUMMARY_AREAS, parts, request=request)

    def drawn() -> str:
        counts, cordoned = remembered(
            "nodes-summary-fleet",
            ["fleet", "placement"],
            [],
            lambda: (fleet_counts(), cordoned_free_by_class()),
            request=request,
        )
        holders = remembered("nodes-summary-holders", ["names"], [], holders_of, request=request)
        readings = remembered(
            "nodes-summary-readings",
            ["fleet", "placement", "readings"],
            parts,
            lambda: SummaryReadings(foreign_held_by_class(), len(unreachable_node_ids())),
            request=request,
        )
        # plain values: its repr is its content
        summary = summary_of_fleet(fleet_summary(counts, holders), cordoned, readings)
        return drawn_from(
            "nodes-summary-drawn",
            summary,
            lambda: render_to_string(
                "catalog/node_list.html#summary", {"summary": summary, "poll": POLL_MARK}
            ),
        )

    html = remembered("nodes-summary", SUMMARY_AREAS, parts, drawn, request=request)
    return stamp, mark_safe(html.replace(POLL_MARK, poll_attributes(reverse("node-list"), stamp)))  # noqa: S308


@requires(VIEW_NODE)
@require_GET
def node_list(request: HttpRequest) -> HttpResponse:
    # Kept under the fleet's versions (versions/cache.py), each part under the areas it shows: the
    # summary's parts (``SUMMARY_AREAS``); the results' grid read under the fleet's, the models', the
    # placement's and the replicas' and drawn by what it was read from (``node_results``), its
    # readings under the readings' and the fleet's (a sampling round throws away only those), put in
    # with the clock's "seen ... ago" and kept by the drawing (``kept_with_readings``); the filters
    # under the fleet's (their choices: the GPU classes). None holds anything of the reader's: the
    # page around is drawn anew.
    # Both poll themselves (LLMGW_PAGE_POLL_SECONDS) with the stamp of what they show: a poll of a
    # part whose versions and clock tick have not moved is a 204 after one query.
    if polled_part(request) == "fleet-summary":
        stamp, summary = summary_html(request)
        return unchanged() if still_shown(request, stamp) else fragment(summary)
    query = normalized(request.GET)
    stamp = stamp_of("nodes-filled", FILLED_AREAS, filled_parts([query.urlencode()]), request=request)
    if still_shown(request, stamp):
        return unchanged()
    foreign_held = foreign_held_for(query)
    found = remembered(
        "nodes-results",
        results_areas(query),
        [query.urlencode(), foreign_held],
        lambda: node_results(query, foreign_held, request=request),
        request=request,
    )
    results = kept_with_readings(
        request, "nodes-filled", found.drawing, found.html, found.node_ids, compact=found.compact
    )
    results = mark_safe(results.replace(POLL_MARK, poll_attributes(_here(query), stamp)))  # noqa: S308 - escaped
    if wants_partial(request):
        return fragment(results)
    return render_page(
        request,
        "catalog/node_list.html",
        {
            "section": "nodes",
            "filters": kept_filters(
                request, "catalog/node_list.html", query, NodeFilterForm.for_fleet, areas=["fleet"]
            ),
            "summary": summary_html(request)[1],
            "results": results,
        },
    )


def drawn_with_digest(html: str) -> tuple[str, str]:
    """A drawing and its digest, which names it (``kept_with_readings``)."""
    return hashlib.sha256(html.encode()).hexdigest(), html


def node_body(node: Node, *, request: HttpRequest | None = None) -> SafeString:
    """A node's page below its actions: the legend, its cards drawn, and the replicas on it;
    marked where its readings and its polling attributes go."""
    cards = list(
        Card.objects.filter(node=node)
        .select_related("gpu_class", "shard__replica__profile__model")
        .order_by("index")
    )
    held: dict[int, tuple[Replica, list[int]]] = {}
    rows = []
    for card in cards:
        shard = getattr(card, "shard", None)
        replica = shard.replica if shard is not None else None
        if replica is not None:
            held.setdefault(replica.pk, (replica, []))[1].append(card.index)
        rows.append(
            (
                node.pk,
                card.index,
                card.gpu_class.name,
                replica.name if replica else None,
                replica.state if replica else None,
                replica.profile.model_id if replica else None,
                replica.profile.model.name if replica else None,
                card.cordoned,
                card.cordon_reason,
            )
        )
    grid = grids([node], rows, request=request)[0]
    replicas = sorted(held.values(), key=lambda pair: pair[0].name)
    return render_to_string(
        "catalog/node_detail.html#body",
        {
            "node": node,
            "grid": grid,
            "replicas": replicas,
            "legend": legend([grid]),
            "poll": POLL_MARK,
        },
    )


@requires(VIEW_NODE)
@require_GET
def node_detail(request: HttpRequest, name: str) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("agent_contact", "reading"), name=name)
    # Its cards and its replicas are kept under the fleet's, the models', the placement's and the
    # replicas' versions, their readings under the readings' and the fleet's, filled kept by the
    # drawing's digest (as the nodes page's results); its actions (by
    # permission, with CSRF tokens), its drains' restarts and its history are drawn per request.
    # It polls itself (LLMGW_PAGE_POLL_SECONDS) with the stamp of what it shows: an unchanged poll
    # is a 204 after one query, a changed one the body alone.
    stamp = stamp_of("node-body-filled", FILLED_AREAS, filled_parts([node.pk]), request=request)
    polled = polled_part(request) == "node-body"
    if polled and still_shown(request, stamp):
        return unchanged()
    digest, drawn = remembered(
        "node-body",
        ["fleet", "models", "placement", "replicas"],
        [node.pk],
        lambda: drawn_with_digest(node_body(node, request=request)),
        request=request,
    )
    body = kept_with_readings(request, "node-body-filled", digest, drawn, [node.pk])
    body = mark_safe(
        body.replace(POLL_MARK, poll_attributes(reverse("node-detail", args=[node.name]), stamp))
    )  # noqa: S308
    if polled:
        return fragment(body)
    can_drain = request.user.has_perm(RESTART)
    return render_page(
        request,
        "catalog/node_detail.html",
        {
            "section": "nodes",
            "node": node,
            "unreachable": not node.reachable or bool(getattr(node, "reading", None) and node.reading.error),
            "body": body,
            "can_drain": can_drain,
            # For the card cordon form: each card's index and whether it is cordoned (one query, and
            # only for who may use it).
            "cards": list(
                Card.objects.filter(node=node)
                .order_by("index")
                .values_list("index", "cordoned", "cordon_reason")
            )
            if can_drain
            else [],
            "drains": [
                operation_views.progress_context(request, op)
                for op in operations_with_steps()
                .filter(cause__startswith=f"drain of {node.name}:")
                .order_by("-id")[:5]
            ],
            **history_context(request, node_history_q(node.name), object_type="node", object=node.name),
        },
    )
