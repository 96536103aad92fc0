"""The nodes: a summary of the fleet, a page of nodes with their cards (free, or held by which
model), filtered; and a node's page with its replicas.

The cards are drawn in Python, not by a template per card: at a thousand nodes the template loop
and its URL lookups were most of the page's time. ``tiles_html`` writes one node's cards as a
tile each (the default view) or as a strip of small marks (the compact view, for many nodes at
once), and ``node_html`` the node around them; every name is escaped, and each model's and node's
link is built once per page.
"""

from __future__ import annotations

import re
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


# Where a card's or a node's readings go in a drawn grid: the grid (the fleet's structure and its
# replicas) is kept under their versions, the readings under theirs, and each request puts the one
# into the other (``with_readings``), so a reading written throws away only the readings.
#   f node card          " foreign" in a card's class when a foreign process holds memory on it
#   t node card          ", foreign process" in a compact free card's title
#   u node card planned  the card's memory bar and line (``use_html``; planned MiB, or "-")
#   s node               when the node's agent last answered (``seen_html``)
MARK = "\x1e"
_MARKS = re.compile("\x1e([futs]):(\\d+)(?::(\\d+))?(?::(-|\\d+))?\x1e")


def tiles_html(
    tiles: list[Tile], links: Links, *, compact: bool = False, planned: dict[str, int] | None = None
) -> SafeString:
    """One node's cards as HTML: a tile each (index, model, replica and its state, memory used
    against planned), or a mark each, with marks where the readings go (``with_readings``)."""
    if not tiles:
        return mark_safe('<li class="muted">No cards.</li>')  # noqa: S308 - constant
    planned = planned or {}
    out = []
    for t in tiles:
        at = f"{t.node_id}:{t.card}"
        foreign = f"{MARK}f:{at}{MARK}"
        if compact:
            if t.free:
                out.append(f'<i class="free{foreign}" title="card {t.card}: free{MARK}t:{at}{MARK}"></i>')
            else:
                out.append(
                    f'<i class="{hue(t.model_id)}{foreign}" title="card {t.card}: {escape(t.model)}"></i>'
                )
        elif t.free:
            out.append(
                f'<li class="card free{foreign}"><span class="idx">card {t.card}</span><span class="holder">free</span>'
                f"{MARK}u:{at}:-{MARK}</li>"
            )
        else:
            rep, state = escape(t.replica), escape(t.state)
            busy = "" if t.state == "ready" else f" · {state}"
            need = planned.get(t.replica or "")
            out.append(
                f'<li class="card held {hue(t.model_id)}{foreign}"><span class="idx">card {t.card}</span>'
                f'<a class="holder" href="{links(t.model or "")}">{escape(t.model)}</a>'
                f'<span class="rep" title="{rep}, {state}">{rep}{busy}</span>'
                f"{MARK}u:{at}:{'-' if need is None else need}{MARK}</li>"
            )
    return mark_safe("".join(out))  # noqa: S308 - every name above is escaped


class Readings(NamedTuple):
    """What the agents last reported of some nodes: each card's use, each node's last answer."""

    use: dict[tuple[int, int], CardUse]
    seen: dict[int, NodeReading]


def readings_of(node_ids: list[int], *, compact: bool = False) -> Readings:
    """Two queries, whatever the number of cards; compact, one: the compact view shows only which
    cards a foreign process holds memory on."""
    if compact:
        return Readings(card_use_of_nodes(node_ids, foreign_only=True), {})
    return Readings(card_use_of_nodes(node_ids), last_seen_of_nodes(node_ids))


# The grid says when each node's agent last answered ("seen 3 minutes ago"): a grid with its readings
# put in is kept at most this long, so that line is never more than this many seconds behind the clock.
SEEN_WITHIN_SECONDS = 10


def kept_with_readings(
    request: HttpRequest,
    name: str,
    parts: list[Any],
    html: str,
    node_ids: list[int],
    *,
    compact: bool = False,
) -> SafeString:
    """A drawn grid (kept under the structure's and the replicas' versions) with these nodes'
    readings put in: the readings kept under the readings' version alone, as data; the grid with
    them put in kept under all three and the clock's 10 s tick, so that a warm request does neither."""

    def filled() -> SafeString:
        readings = remembered(
            "node-readings",
            ["readings"],
            [tuple(node_ids), compact],
            lambda: readings_of(node_ids, compact=compact),
            request=request,
        )
        return with_readings(html, readings)

    tick = int(time.time() // SEEN_WITHIN_SECONDS)
    return remembered(
        name, ["structure", "placement", "replicas", "readings"], [*parts, tick], filled, request=request
    )


def with_readings(html: str, readings: Readings) -> SafeString:
    """A drawn grid with its readings put in at their marks (``tiles_html``, ``node_html``)."""

    def fill(m: re.Match) -> str:
        kind, node = m.group(1), int(m.group(2))
        if kind == "s":
            return seen_html(readings.seen.get(node))
        use = readings.use.get((node, int(m.group(3))))
        if kind == "u":
            planned = m.group(4)
            return use_html(use, None if planned in (None, "-") else int(planned))
        foreign = use is not None and bool(use.foreign_mib)
        if kind == "f":
            return " foreign" if foreign else ""
        return ", foreign process" if foreign else ""

    return mark_safe(_MARKS.sub(fill, html))  # noqa: S308 - the grid is escaped, and so is each filling


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
        f'<span>{escape(g.classes)}</span><span class="muted">{g.free} free</span>{MARK}s:{node.pk}{MARK}</header>'
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
    """Each node with its cards drawn and the node drawn around them (``row``), marked where the
    readings go (``with_readings``): one query more (the replicas' planned memory), whatever the
    number of cards."""
    by_id = {n.pk: NodeGrid(n) for n in nodes}
    for row in rows:
        by_id[row[0]].tiles.append(Tile(*row))
    planned = (
        {} if compact else planned_per_card({t.replica for g in by_id.values() for t in g.tiles if t.replica})
    )
    models, nodes_at = Links("model-detail"), Links("node-detail")
    for g in by_id.values():
        g.html = tiles_html(g.tiles, models, compact=compact, planned=planned)
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


class Results(NamedTuple):
    html: str  # marked where the readings go
    node_ids: list[int]
    compact: bool  # drawn compact: the only reading it shows is whether a foreign process holds memory


def node_results(query: QueryDict) -> Results:
    """The nodes page's results (count, legend, the page of nodes with their cards, pager) for the
    query's filters and page, marked where the readings go, and the nodes shown: what an htmx
    filter swaps in, and the page shows."""
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
    html = render_to_string(
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
    return Results(html, [n.pk for n in nodes], view == "compact")


@requires(VIEW_NODE)
@require_GET
def node_list(request: HttpRequest) -> HttpResponse:
    # Kept under the fleet's versions (versions/cache.py), each part under the areas it shows: the
    # summary under the structure's and the placement's (which cards are held, by which model: not
    # the replicas' states), the results' grid under those and the replicas', the grid's readings
    # under the readings' (a sampling round throws away only those), put in at each request with
    # the clock's "seen ... ago". None holds anything of the reader's: the page around is drawn anew.
    query = normalized(request.GET)
    found = remembered(
        "nodes-results",
        ["structure", "placement", "replicas"],
        [query.urlencode()],
        lambda: node_results(query),
        request=request,
    )
    results = kept_with_readings(
        request, "nodes-filled", [query.urlencode()], found.html, found.node_ids, compact=found.compact
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
                "nodes-summary", ["structure", "placement"], [], fleet_summary, request=request
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
    # Its cards and its replicas are kept under the structure's and the replicas' versions, their
    # readings under the readings' (as the nodes page's results); its actions (by permission, with
    # CSRF tokens), its drains' restarts and its history are drawn per request.
    body = remembered(
        "node-body",
        ["structure", "placement", "replicas"],
        [node.pk],
        lambda: node_body(node),
        request=request,
    )
    body = kept_with_readings(request, "node-body-filled", [node.pk], body, [node.pk])
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
