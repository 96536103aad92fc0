"""The nodes: a summary of the fleet, a page of nodes with their cards (free, or held by which
model), filtered; and a node's page with its replicas.

The cards are drawn in Python, not by a template per card: at a thousand nodes the template loop
and its URL lookups were most of the page's time. ``tiles_html`` writes one node's cards as a
tile each (the default view) or as a strip of small marks (the compact view, for many nodes at
once), and ``node_html`` the node around them; every name is escaped, and each model's and node's
link is built once per page.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.core.paginator import Paginator
from django.db.models import Count, Q
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
    poll_attributes,
    polled_part,
    render_page,
    stamp_of,
    still_shown,
    unchanged,
    wants_partial,
)
from catalog.models import Card, Node, Replica
from catalog.selectors import cards_of, fleet_summary, nodes_matching
from catalog.services.fit import profile_memory
from operations import views as operation_views
from operations.selectors import operations_with_steps
from telemetry.models import NodeReading
from telemetry.selectors import (
    CardUse,
    card_use_of_nodes,
    foreign_held_card_ids,
    last_seen_of_nodes,
    unreachable_node_ids,
)
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
    cordoned: bool = False  # cordoned on its own (card_cordon): no new placement on it
    cordon_reason: str = ""

    @property
    def free(self) -> bool:
        """No replica holds it and it takes placements (not cordoned)."""
        return self.replica is None and not self.cordoned


@dataclass
class NodeGrid:
    node: Node
    tiles: list[Tile] = field(default_factory=list)
    html: SafeString = mark_safe("")  # noqa: S308 - empty
    row: SafeString = mark_safe("")  # noqa: S308 - empty

    @property
    def free(self) -> int:
        """Cards no replica holds and not cordoned; a foreign process's hold is a reading, taken off
        when the readings are put in (``with_readings``)."""
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


def _age(use: CardUse) -> str:
    return f"read {timesince(use.at)} ago" if use.at is not None else "never read"


def use_html(use: CardUse | None, planned: int | None, *, old: bool = False) -> str:
    """A card's memory in use (from its agent) against what the plan holds on it, as a bar and a
    line: "used 72.0 of 79.6 GiB · planned 14.9 · 85% · 61 °C"; foreign memory said as such.
    ``old``: its agent is not answering, so the reading is greyed and says its age."""
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
    if old:
        words.append(_age(use))
    foreign = (
        f'<span class="foreign-note">foreign process: {_gib(use.foreign_mib)} GiB</span>'
        if use.foreign_mib
        else ""
    )
    stale = " stale" if old else ""
    return (
        f'<span class="usebar{stale}" aria-hidden="true">{"".join(marks)}</span>'
        f'<span class="use{stale}">{" · ".join(words)}</span>{foreign}'
    )


def foreign_said(use: CardUse) -> str:
    """Who holds a card the catalog thinks free: each process's name and PID, as nvidia-smi gave them."""
    said = [f"{name} (PID {pid})" if pid is not None else name for name, pid in use.foreign]
    return ", ".join(said) or "a process the catalog does not know"


# Where a card's or a node's readings go in a drawn grid: the grid (the fleet's structure, its
# placement and its replicas) is kept under their versions, the readings under theirs, and each
# request puts the one into the other (``with_readings``), so a reading written throws away only the
# readings. A mark is MARK kind:args MARK, the args colon-separated:
#   f node card                 " foreign" in a card's class when a foreign process holds memory on it
#   u node card planned         the card's memory bar and line (``use_html``; planned MiB, or "-")
#   F node card compact         a free card: drawn free, or held by the foreign process nvidia-smi names
#   n node free cards           the node's free count, less its free cards a foreign process holds
#   h node cards                "N held by foreign processes" where some are
#   a node                      " unreachable" in the node's class when its agent is not answering
#   b node state compact        the node's badges (``badges_html``)
#   s node                      when the node's agent last answered (``seen_html``)
# (cards: the free cards' indices, dot-separated.)
MARK = "\x1e"
_MARKS = re.compile("\x1e([fuFnhabs]):([^\x1e]*)\x1e")


def tiles_html(
    tiles: list[Tile], links: Links, *, compact: bool = False, planned: dict[str, int] | None = None
) -> SafeString:
    """One node's cards as HTML: a tile each (index, model, replica and its state, memory used
    against planned), or a mark each, with marks where the readings go (``with_readings``). A card
    cordoned on its own says so and why; a free card a foreign process holds is drawn held by it."""
    if not tiles:
        return mark_safe('<li class="muted">No cards.</li>')  # noqa: S308 - constant
    planned = planned or {}
    out = []
    for t in tiles:
        at = f"{t.node_id}:{t.card}"
        foreign = f"{MARK}f:{at}{MARK}"
        flag = (
            f'<span class="card-flag">cordoned{": " + escape(t.cordon_reason) if t.cordon_reason else ""}</span>'
            if t.cordoned
            else ""
        )
        cordoned = " cordoned-card" if t.cordoned else ""
        if t.free:
            out.append(f"{MARK}F:{at}:{int(compact)}{MARK}")
        elif t.replica is None:  # cordoned, nothing on it
            if compact:
                out.append(f'<i class="free cordoned-card" title="card {t.card}: cordoned"></i>')
            else:
                out.append(
                    f'<li class="card cordoned-card{foreign}"><span class="idx">card {t.card}</span>'
                    f'<span class="holder">not placed on</span>{flag}{MARK}u:{at}:-{MARK}</li>'
                )
        elif compact:
            out.append(
                f'<i class="{hue(t.model_id)}{foreign}{cordoned}" title="card {t.card}: {escape(t.model)}"></i>'
            )
        else:
            rep, state = escape(t.replica), escape(t.state)
            busy = "" if t.state == "ready" else f" · {state}"
            need = planned.get(t.replica or "")
            out.append(
                f'<li class="card held {hue(t.model_id)}{foreign}{cordoned}"><span class="idx">card {t.card}</span>'
                f'<a class="holder" href="{links(t.model or "")}">{escape(t.model)}</a>'
                f'<span class="rep" title="{rep}, {state}">{rep}{busy}</span>{flag}'
                f"{MARK}u:{at}:{'-' if need is None else need}{MARK}</li>"
            )
    return mark_safe("".join(out))  # noqa: S308 - every name above is escaped


def free_tile_html(card: int, use: CardUse | None, *, compact: bool, old: bool) -> str:
    """A free card: free, or held by a process the catalog does not know (its name and PID, as
    nvidia-smi gave them: placement takes it no more than a replica's)."""
    foreign = " foreign" if use is not None and use.foreign_mib else ""
    if use is not None and use.foreign_held:
        who = escape(foreign_said(use))
        if compact:
            return f'<i class="foreign-held foreign" title="card {card}: held by {who}"></i>'
        return (
            f'<li class="card foreign-held foreign"><span class="idx">card {card}</span>'
            f'<span class="holder">held by {who}</span>{use_html(use, None, old=old)}</li>'
        )
    if compact:
        return f'<i class="free{foreign}" title="card {card}: free{foreign and ", foreign process"}"></i>'
    return (
        f'<li class="card free{foreign}"><span class="idx">card {card}</span><span class="holder">free</span>'
        f"{use_html(use, None, old=old)}</li>"
    )


class Readings(NamedTuple):
    """What the agents last reported of some nodes: each card's use, each node's last answer, and
    the nodes whose agent is not answering (the reconciler's word on the node, or the sampler's)."""

    use: dict[tuple[int, int], CardUse]
    seen: dict[int, NodeReading]
    away: frozenset[int]


def readings_of(node_ids: list[int], *, compact: bool = False) -> Readings:
    """Three queries, whatever the number of cards; compact, two: the compact view shows only which
    cards a foreign process holds memory on."""
    away = frozenset(
        Node.objects.filter(pk__in=node_ids)
        .filter(Q(reachable=False) | Q(reading__error__gt=""))
        .values_list("pk", flat=True)
    )
    if compact:
        return Readings(card_use_of_nodes(node_ids, foreign_only=True), {}, away)
    return Readings(card_use_of_nodes(node_ids), last_seen_of_nodes(node_ids), away)


# The grid says when each node's agent last answered ("seen 3 minutes ago"): a grid with its readings
# put in is kept at most this long, so that line is never more than this many seconds behind the clock.
SEEN_WITHIN_SECONDS = 10
FILLED_AREAS = ["structure", "placement", "replicas", "readings"]


def filled_parts(parts: list[Any]) -> list[Any]:
    """A filled grid's key parts: its own, and the clock's 10 s tick."""
    return [*parts, int(time.time() // SEEN_WITHIN_SECONDS)]


def kept_with_readings(
    request: HttpRequest,
    name: str,
    parts: list[Any],
    html: str,
    node_ids: list[int],
    *,
    compact: bool = False,
) -> SafeString:
    """A drawn grid (kept under the structure's, the placement's and the replicas' versions) with
    these nodes' readings put in: the readings kept as data under the readings' version (and the
    structure's, which says which nodes the reconciler found unreachable); the grid with them put in
    kept under all four and the clock's 10 s tick (``filled_parts``), so that a warm request does
    neither."""

    def filled() -> SafeString:
        readings = remembered(
            "node-readings",
            ["readings", "structure"],
            [tuple(node_ids), compact],
            lambda: readings_of(node_ids, compact=compact),
            request=request,
        )
        return with_readings(html, readings)

    return remembered(name, FILLED_AREAS, filled_parts(parts), filled, request=request)


def with_readings(html: str, readings: Readings) -> SafeString:
    """A drawn grid with its readings put in at their marks (``tiles_html``, ``node_html``)."""

    def held(node: int, cards: str) -> int:
        return sum(
            1
            for c in cards.split(".")
            if c and (u := readings.use.get((node, int(c)))) is not None and u.foreign_held
        )

    def fill(m: re.Match) -> str:
        kind, args = m.group(1), m.group(2).split(":")
        node = int(args[0])
        old = node in readings.away
        if kind == "s":
            return seen_html(readings.seen.get(node))
        if kind == "a":
            return " unreachable" if old else ""
        if kind == "b":
            return badges_html(args[1], unreachable=old, compact=args[2] == "1")
        if kind == "n":
            return str(int(args[1]) - held(node, args[2]))
        if kind == "h":
            n = held(node, args[1])
            return f'<span class="muted">{n} held by foreign processes</span>' if n else ""
        use = readings.use.get((node, int(args[1])))
        if kind == "u":
            return use_html(use, None if args[2] == "-" else int(args[2]), old=old)
        if kind == "F":
            return free_tile_html(int(args[1]), use, compact=args[2] == "1", old=old)
        return " foreign" if use is not None and use.foreign_mib else ""  # f

    return mark_safe(_MARKS.sub(fill, html))  # noqa: S308 - the grid is escaped, and so is each filling


def seen_html(seen: NodeReading | None) -> str:
    """When the node's agent last answered a telemetry request, or that it does not."""
    if seen is None:
        return ""
    when = f"agent seen {timesince(seen.seen_at)} ago" if seen.seen_at else "agent never answered"
    if seen.error:
        return f'<span class="seen bad" title="{escape(seen.error)}">{when} · not answering</span>'
    return f'<span class="seen">{when}</span>'


NOT_ANSWERING = '<span class="badge state-unreachable">Not answering</span>'


def badges_html(state: str, *, unreachable: bool, compact: bool = False) -> str:
    """A node's badges: its state, except that a node whose agent is not answering is never shown
    ready (a cordoned or down one says both)."""
    said = state if compact else str(Node.State(state).label)
    badge = f'<span class="badge state-{escape(state)}">{escape(said)}</span>'
    if unreachable:
        return NOT_ANSWERING if state == Node.State.READY else f"{badge} {NOT_ANSWERING}"
    return "" if compact and state == Node.State.READY else badge


def node_html(g: NodeGrid, link: str, *, compact: bool = False) -> str:
    """One node as the grid shows it: its name, state (or that its agent is not answering), classes
    and free count over its cards (``g.html``), or, compact, a line of its name and a mark per card;
    marked where the readings go."""
    node = g.node
    name, state = escape(node.name), escape(node.state)
    pk = node.pk
    free_cards = ".".join(str(t.card) for t in g.tiles if t.free)
    away = f"{MARK}a:{pk}{MARK}"
    badges = f"{MARK}b:{pk}:{state}:{int(compact)}{MARK}"
    free = f"{MARK}n:{pk}:{g.free}:{free_cards}{MARK}"
    if compact:
        return (
            f'<li class="strip state-{state}{away}"><a href="{link}">{name}</a> {badges}'
            f'<span class="marks" aria-label="{free} of {len(g.tiles)} cards free">{g.html}</span></li>'
        )
    return (
        f'<section class="node state-{state}{away}" aria-labelledby="node-{pk}">'
        f'<header class="node-head"><h2 id="node-{pk}"><a href="{link}">{name}</a></h2>'
        f'{badges}<span>{escape(g.classes)}</span><span class="muted free-count">{free} free</span>'
        f"{MARK}h:{pk}:{free_cards}{MARK}{MARK}s:{pk}{MARK}</header>"
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


def node_results(query: QueryDict, foreign_held: Collection[int] = ()) -> Results:
    """The nodes page's results (count, legend, the page of nodes with their cards, pager) for the
    query's filters and page, marked where the readings go, and the nodes shown: what an htmx
    filter swaps in, and the page shows. ``foreign_held``: the cards a foreign process holds, which
    the free filter does not count free (``foreign_held_for``)."""
    form = NodeFilterForm.for_fleet(query or None)
    valid = form.is_bound and form.is_valid()
    data = form.cleaned_data if valid else {}
    view = data.get("view") or "cards"
    filters = {k: v for k, v in data.items() if k != "view" and v not in (None, "")}
    matching = nodes_matching(filters, not_free=foreign_held)
    page = Paginator(matching, PAGE_SIZES[view]).get_page(query.get("page"))
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
            "poll": POLL_MARK,
        },
    )
    return Results(html, [n.pk for n in nodes], view == "compact")


def foreign_held_for(query: QueryDict) -> list[int]:
    """The cards a foreign process holds (fresh readings say so), when the free filter asks for
    them (its count leaves them out, as the grid does), by id; else none, and no query. The kept
    results are keyed on them too, so a card a foreign process takes or lets go is counted anew."""
    return sorted(foreign_held_card_ids()) if query.get("free", "").strip() else []


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


# The summary's parts: the fleet's (cards by class, held by which model, cordoned) under the structure's
# and the placement's versions; its readings' (foreign holds, agents not answering) under the readings'
# (and the structure's and placement's, which say which cards are free and nodes reachable); drawn
# under all three and the clock's 10 s tick (a foreign process's reading stops counting as it ages
# past LLMGW_TELEMETRY_STALE_SECONDS, which no write says).
SUMMARY_AREAS = ["structure", "placement", "readings"]


def summary_html(request: HttpRequest) -> tuple[str, SafeString]:
    """The summary's stamp and the summary drawn, polling itself (``SUMMARY_AREAS``)."""
    parts = [int(time.time() // SEEN_WITHIN_SECONDS)]
    stamp = stamp_of("nodes-summary", SUMMARY_AREAS, parts, request=request)

    def drawn() -> str:
        fleet, cordoned = remembered(
            "nodes-summary-fleet",
            ["structure", "placement"],
            [],
            lambda: (fleet_summary(), cordoned_free_by_class()),
            request=request,
        )
        readings = remembered(
            "nodes-summary-readings",
            SUMMARY_AREAS,
            parts,
            lambda: SummaryReadings(foreign_held_by_class(), len(unreachable_node_ids())),
            request=request,
        )
        return render_to_string(
            "catalog/node_list.html#summary",
            {"summary": summary_of_fleet(fleet, cordoned, readings), "poll": POLL_MARK},
        )

    html = remembered("nodes-summary", SUMMARY_AREAS, parts, drawn, request=request)
    return stamp, mark_safe(html.replace(POLL_MARK, poll_attributes(reverse("node-list"), stamp)))  # noqa: S308


@requires(VIEW_NODE)
@require_GET
def node_list(request: HttpRequest) -> HttpResponse:
    # Kept under the fleet's versions (versions/cache.py), each part under the areas it shows: the
    # summary under the structure's, the placement's and the readings' (foreign holds, agents not
    # answering); the results' grid under the structure's, the placement's and the replicas', its
    # readings under the readings' (a sampling round throws away only those), put in with the
    # clock's "seen ... ago". None holds anything of the reader's: the page around is drawn anew.
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
        ["structure", "placement", "replicas"],
        [query.urlencode(), foreign_held],
        lambda: node_results(query, foreign_held),
        request=request,
    )
    results = kept_with_readings(
        request, "nodes-filled", [query.urlencode()], found.html, found.node_ids, compact=found.compact
    )
    results = mark_safe(results.replace(POLL_MARK, poll_attributes(_here(query), stamp)))  # noqa: S308 - escaped
    if wants_partial(request):
        return fragment(results)
    return render_page(
        request,
        "catalog/node_list.html",
        {
            "section": "nodes",
            "filters": kept_filters(request, "catalog/node_list.html", query, NodeFilterForm.for_fleet),
            "summary": summary_html(request)[1],
            "results": results,
        },
    )


def node_body(node: Node) -> SafeString:
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
    grid = grids([node], rows)[0]
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
    # Its cards and its replicas are kept under the structure's, the placement's and the replicas'
    # versions, their readings under the readings' (as the nodes page's results); its actions (by
    # permission, with CSRF tokens), its drains' restarts and its history are drawn per request.
    # It polls itself (LLMGW_PAGE_POLL_SECONDS) with the stamp of what it shows: an unchanged poll
    # is a 204 after one query, a changed one the body alone.
    stamp = stamp_of("node-body-filled", FILLED_AREAS, filled_parts([node.pk]), request=request)
    polled = polled_part(request) == "node-body"
    if polled and still_shown(request, stamp):
        return unchanged()
    drawn = remembered(
        "node-body",
        ["structure", "placement", "replicas"],
        [node.pk],
        lambda: node_body(node),
        request=request,
    )
    body = kept_with_readings(request, "node-body-filled", [node.pk], drawn, [node.pk])
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
