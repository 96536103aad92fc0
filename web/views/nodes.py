"""The nodes: a summary of the fleet, a page of nodes with their cards (free, or held by which
model), filtered; and a node's page with its replicas.

The cards are drawn in Python, not by a template per card: at a thousand nodes the template loop
and its URL lookups were most of the page's time. ``tiles_html`` writes one node's cards as a
tile each (the default view) or as a strip of small marks (the compact view, for many nodes at
once), and ``node_html`` the node around them; every name is escaped, and each model's and node's
link is built once per page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince
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
    render_page,
    wants_partial,
)
from catalog.models import Card, Node, Replica
from catalog.selectors import cards_of, fleet_summary, nodes_matching
from catalog.services.fit import profile_memory
from operations import views as operation_views
from operations.selectors import operations_with_steps
from telemetry.models import NodeReading
from telemetry.selectors import CardUse, card_use_of_nodes, last_seen_of_nodes
from versions.cache import remembered
from web.display import hue
from web.forms import NodeFilterForm

# Nodes on a page: a tile per card is about 170 bytes, so 50 nodes of 8 cards stay well under 200 kB;
# a compact mark is a fifth of that.
PAGE_SIZES = {"cards": 50, "compact": 500}


class Tile(NamedTuple):
    """One card as the grid shows it (a row of ``selectors.CARD_ROW``)."""

    node_id: int
    card: int  # the card's index on its node
    gpu_class: str
    replica: str | None
    state: str | None
    model_id: int | None
    model: str | None

    @property
    def free(self) -> bool:
        return self.replica is None


@dataclass
class NodeGrid:
    node: Node
    tiles: list[Tile] = field(default_factory=list)
    html: SafeString = mark_safe("")  # noqa: S308 - empty
    row: SafeString = mark_safe("")  # noqa: S308 - empty
    seen: NodeReading | None = None  # when its agent last answered a telemetry request

    @property
    def free(self) -> int:
        return sum(t.free for t in self.tiles)

    @property
    def classes(self) -> str:
        """ "8 × h100-80g", or each class's count when a node mixes them."""
        counts: dict[str, int] = {}
        for t in self.tiles:
            counts[t.gpu_class] = counts.get(t.gpu_class, 0) + 1
        return ", ".join(f"{n} × {c}" for c, n in counts.items()) or "no cards"


class Links:
    """A page address per name (a model's, a node's), reversed once and then reused, escaped
    (names are URL-safe by validation): a page of 500 nodes reversed 500 times otherwise."""

    def __init__(self, url_name: str) -> None:
        self._prefix = reverse(url_name, args=["x"])[:-2]
        self._escaped: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        link = self._escaped.get(name)
        if link is None:
            link = self._escaped[name] = escape(f"{self._prefix}{name}/")
        return link


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"


def use_html(use: CardUse | None, planned: int | None) -> str:
    """A card's memory in use (from its agent) against what the plan holds on it, as a bar and a
    line: "used 72.0 of 79.6 GiB · planned 14.9 · 85% · 61 °C"; foreign memory said as such."""
    if use is None or use.used_mib is None or not use.total_mib:
        if planned is None:
            return ""
        return f'<span class="use muted">planned {_gib(planned)} GiB · not measured</span>'
    used_at = min(100, round(100 * use.used_mib / use.total_mib))
    marks = [f'<span class="used" style="width: {used_at}%"></span>']
    if planned is not None:
        marks.append(
            f'<span class="planned" style="left: {min(100, round(100 * planned / use.total_mib))}%"></span>'
        )
    words = [f"used {_gib(use.used_mib)} of {_gib(use.total_mib)} GiB"]
    if planned is not None:
        words.append(f"planned {_gib(planned)}")
    if use.utilization is not None:
        words.append(f"{use.utilization}%")
    if use.temperature is not None:
        words.append(f"{use.temperature} °C")
    foreign = (
        f'<span class="foreign-note">foreign process: {_gib(use.foreign_mib)} GiB</span>'
        if use.foreign_mib
        else ""
    )
    return (
        f'<span class="usebar" aria-hidden="true">{"".join(marks)}</span>'
        f'<span class="use">{" · ".join(words)}</span>{foreign}'
    )


def tiles_html(
    tiles: list[Tile],
    links: Links,
    *,
    compact: bool = False,
    use: dict[tuple[int, int], CardUse] | None = None,
    planned: dict[str, int] | None = None,
) -> SafeString:
    """One node's cards as HTML: a tile each (index, model, replica and its state, memory used
    against planned), or a mark each. A card a foreign process holds memory on is marked."""
    if not tiles:
        return mark_safe('<li class="muted">No cards.</li>')  # noqa: S308 - constant
    use = use or {}
    planned = planned or {}
    out = []
    for t in tiles:
        u = use.get((t.node_id, t.card))
        foreign = " foreign" if u is not None and u.foreign_mib else ""
        if compact:
            if t.free:
                out.append(
                    f'<i class="free{foreign}" title="card {t.card}: free{foreign and ", foreign process"}"></i>'
                )
            else:
                out.append(
                    f'<i class="{hue(t.model_id)}{foreign}" title="card {t.card}: {escape(t.model)}"></i>'
                )
        elif t.free:
            out.append(
                f'<li class="card free{foreign}"><span class="idx">card {t.card}</span><span class="holder">free</span>'
                f"{use_html(u, None)}</li>"
            )
        else:
            rep, state = escape(t.replica), escape(t.state)
            busy = "" if t.state == "ready" else f" · {state}"
            out.append(
                f'<li class="card held {hue(t.model_id)}{foreign}"><span class="idx">card {t.card}</span>'
                f'<a class="holder" href="{links(t.model or "")}">{escape(t.model)}</a>'
                f'<span class="rep" title="{rep}, {state}">{rep}{busy}</span>'
                f"{use_html(u, planned.get(t.replica or ''))}</li>"
            )
    return mark_safe("".join(out))  # noqa: S308 - every name above is escaped


def seen_html(seen: NodeReading | None) -> str:
    """When the node's agent last answered a telemetry request, or that it does not."""
    if seen is None:
        return ""
    when = f"agent seen {timesince(seen.seen_at)} ago" if seen.seen_at else "agent never answered"
    if seen.error:
        return f'<span class="seen bad" title="{escape(seen.error)}">{when} · not answering</span>'
    return f'<span class="seen">{when}</span>'


def node_html(g: NodeGrid, link: str, *, compact: bool = False) -> str:
    """One node as the grid shows it: its name, state, classes and free count over its cards
    (``g.html``), or, compact, a line of its name and a mark per card."""
    node = g.node
    name, state = escape(node.name), escape(node.state)
    if compact:
        badge = "" if node.state == Node.State.READY else f' <span class="badge state-{state}">{state}</span>'
        return (
            f'<li class="strip state-{state}"><a href="{link}">{name}</a>{badge}'
            f'<span class="marks" aria-label="{g.free} of {len(g.tiles)} cards free">{g.html}</span></li>'
        )
    return (
        f'<section class="node state-{state}" aria-labelledby="node-{node.pk}">'
        f'<header class="node-head"><h2 id="node-{node.pk}"><a href="{link}">{name}</a></h2>'
        f'<span class="badge state-{state}">{escape(node.get_state_display())}</span>'
        f'<span>{escape(g.classes)}</span><span class="muted">{g.free} free</span>{seen_html(g.seen)}</header>'
        f'<ol class="cards">{g.html}</ol></section>'
    )


def planned_per_card(replica_names: set[str]) -> dict[str, int]:
    """Each replica's planned need on one of its cards, in MiB: what it recorded when it started,
    else its profile's as the memory model reckons it (once per profile): one query."""
    out: dict[str, int] = {}
    by_profile: dict[int, int | None] = {}
    for r in Replica.objects.filter(name__in=replica_names).select_related(
        "profile__model", "profile__gpu_class"
    ):
        need = (r.planned_memory or {}).get("need")
        if not isinstance(need, int):
            if r.profile_id not in by_profile:
                memory = profile_memory(r.profile, r.profile.model)
                by_profile[r.profile_id] = memory.need if memory is not None else None
            need = by_profile[r.profile_id]
        if isinstance(need, int):
            out[r.name] = need // 2**20
    return out


def grids(nodes: list[Node], rows: list[tuple], *, compact: bool = False) -> list[NodeGrid]:
    """Each node with its cards drawn, with what their agents last reported, and the node drawn
    around them (``row``): three queries more, whatever the number of cards."""
    by_id = {n.pk: NodeGrid(n) for n in nodes}
    for row in rows:
        by_id[row[0]].tiles.append(Tile(*row))
    ids = list(by_id)
    use = card_use_of_nodes(ids)
    seen = last_seen_of_nodes(ids)
    planned = (
        {} if compact else planned_per_card({t.replica for g in by_id.values() for t in g.tiles if t.replica})
    )
    models, nodes_at = Links("model-detail"), Links("node-detail")
    for g in by_id.values():
        g.seen = seen.get(g.node.pk)
        g.html = tiles_html(g.tiles, models, compact=compact, use=use, planned=planned)
        g.row = mark_safe(node_html(g, nodes_at(g.node.name), compact=compact))  # noqa: S308 - escaped
    return list(by_id.values())


def rows_html(node_grids: list[NodeGrid]) -> SafeString:
    """The page's nodes, one string: a template loop over 500 nodes cost more than drawing them."""
    return mark_safe("".join(g.row for g in node_grids))  # noqa: S308 - each row is escaped


def legend(node_grids: list[NodeGrid]) -> list[tuple[str, str, int, str]]:
    """The models holding cards on these nodes: name, colour, card count and page link, by name."""
    seen: dict[int, list[Any]] = {}
    for g in node_grids:
        for t in g.tiles:
            if t.model_id is not None:
                seen.setdefault(t.model_id, [t.model, hue(t.model_id), 0])[2] += 1
    links = Links("model-detail")
    return sorted(((name, colour, n, links(name)) for name, colour, n in seen.values()), key=lambda v: v[0])


# The grid says when each node's agent last answered ("seen 3 minutes ago"): a kept grid is drawn
# anew at least this often, so that line is never more than this many seconds behind the clock.
SEEN_WITHIN_SECONDS = 10


def node_results(query: QueryDict) -> SafeString:
    """The nodes page's results (count, legend, the page of nodes with their cards, pager) for the
    query's filters and page: what an htmx filter swaps in, and the page shows."""
    form = NodeFilterForm.for_fleet(query or None)
    valid = form.is_bound and form.is_valid()
    data = form.cleaned_data if valid else {}
    view = data.get("view") or "cards"
    filters = {k: v for k, v in data.items() if k != "view" and v not in (None, "")}
    page = Paginator(nodes_matching(filters), PAGE_SIZES[view]).get_page(query.get("page"))
    nodes = list(page.object_list)
    node_grids = grids(nodes, cards_of([n.pk for n in nodes]), compact=view == "compact")
    rest = query.copy()
    rest.pop("page", None)
    return render_to_string(
        "catalog/node_list.html#results",
        {
            "form": form,
            "page": page,
            "grids": node_grids,
            "rows": rows_html(node_grids),
            "legend": legend(node_grids),
            "compact": view == "compact",
            "filtered": bool(filters),
            "query": rest.urlencode(),
        },
    )


@requires(VIEW_NODE)
@require_GET
def node_list(request: HttpRequest) -> HttpResponse:
    # The summary and the results are kept under the fleet's versions (versions/cache.py): the
    # summary reads the catalog; the results also the cards' telemetry, and say how long ago each
    # agent answered. Neither holds anything of the reader's: the page around them is drawn anew.
    query = normalized(request.GET)
    results = remembered(
        "nodes-results",
        ["structure", "replicas", "readings"],
        [query.urlencode(), int(time.time() // SEEN_WITHIN_SECONDS)],
        lambda: node_results(query),
        request=request,
    )
    if wants_partial(request):
        return fragment(results)
    return render_page(
        request,
        "catalog/node_list.html",
        {
            "section": "nodes",
            "filters": kept_filters(request, "catalog/node_list.html", query, NodeFilterForm.for_fleet),
            "summary": remembered(
                "nodes-summary", ["structure", "replicas"], [], fleet_summary, request=request
            ),
            "results": results,
        },
    )


def node_body(node: Node) -> SafeString:
    """A node's page below its actions: the legend, its cards drawn, and the replicas on it."""
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
            )
        )
    grid = grids([node], rows)[0]
    replicas = sorted(held.values(), key=lambda pair: pair[0].name)
    return render_to_string(
        "catalog/node_detail.html#body",
        {"node": node, "grid": grid, "replicas": replicas, "legend": legend([grid])},
    )


@requires(VIEW_NODE)
@require_GET
def node_detail(request: HttpRequest, name: str) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("agent_contact"), name=name)
    # Its cards, their readings and its replicas are kept under the fleet's versions (as the nodes
    # page's results, and drawn anew as often, for the agent's "seen ... ago"); its actions (by
    # permission, with CSRF tokens), its drains' restarts and its history are drawn per request.
    body = remembered(
        "node-body",
        ["structure", "replicas", "readings"],
        [node.pk, int(time.time() // SEEN_WITHIN_SECONDS)],
        lambda: node_body(node),
        request=request,
    )
    return render_page(
        request,
        "catalog/node_detail.html",
        {
            "section": "nodes",
            "node": node,
            "body": body,
            "can_drain": request.user.has_perm(RESTART),
            "drains": [
                operation_views.progress_context(request, op)
                for op in operations_with_steps()
                .filter(cause__startswith=f"drain of {node.name}:")
                .order_by("-id")[:5]
            ],
            **history_context(request, node_history_q(node.name), object_type="node", object=node.name),
        },
    )
