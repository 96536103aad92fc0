"""The nodes grid, drawn in Python rather than by a template per card (at a thousand nodes the template
loop and its URL lookups were most of the page's time): ``tiles_html`` writes one node's cards as a
tile each (the default view) or as a strip of small marks (the compact view), ``node_html`` the node
around them; every name is escaped, and each model's and node's link is built once per page.

The grid is drawn with a mark where each reading goes (``MARK``) and kept by what it is drawn from;
the readings are kept under their own version and put in at the marks (``kept_with_readings``,
``with_readings``), the filled grid kept by the drawing and the readings, so a sampling round redraws
no grid and a write that changes nothing drawn fills none.
The views that use it are in ``web/views/nodes.py``.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.db.models import Q
from django.http import HttpRequest
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

from catalog.models import Node, Profile, Replica
from catalog.services.fit import need_columns, need_of_row
from telemetry.models import NodeReading
from telemetry.selectors import (
    CardUse,
    card_use_of_nodes,
    last_seen_of_nodes,
)
from versions.cache import remembered
from web.display import hue


def escape(text: object) -> str:
    """As ``django.utils.html.escape`` (the same five characters), without its lazy-string wrapper and
    ``SafeString`` per call: a compact page escapes thousands of names; the grid is marked safe whole."""
    return html.escape(str(text))


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
    rank: int | None = None  # the rank of the replica that holds it
    rendezvous: int | None = None  # its replica's rendezvous port: set only on a replica across nodes

    @property
    def group_rank(self) -> int | None:
        """The holder's rank when it is a replica across nodes (its ranks share the model's colour)."""
        return self.rank if self.replica is not None and self.rendezvous is not None else None

    @property
    def free(self) -> bool:
        """No replica holds it and it takes placements (not cordoned)."""
        return self.replica is None and not self.cordoned


class NodeRow(NamedTuple):
    """What the grid shows of a node itself (a page of 500 read as values, not objects)."""

    pk: int
    name: str
    state: str


@dataclass
class NodeGrid:
    node: NodeRow | Node
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
    # Written short (no space in the styles, no aria-hidden on a bar with no text, which a screen
    # reader passes over): the tile repeats 400 times a page, whose 200 kB bar a reading on every
    # card had pushed to 206 kB.
    marks = [f'<span class="used" style="width:{used_at}%"></span>']
    if planned is not None:
        marks.append(
            f'<span class="planned" style="left:{min(100, round(100 * planned / use.total_mib))}%"></span>'
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
        f'<span class="usebar{stale}">{"".join(marks)}</span>'
        f'<span class="use{stale}">{" · ".join(words)}</span>{foreign}'
    )


def foreign_said(use: CardUse) -> str:
    """Who holds a card the catalog thinks free: each process's name and PID, as nvidia-smi gave them."""
    said = [f"{name} (PID {pid})" if pid is not None else name for name, pid in use.foreign]
    return ", ".join(said) or "a process the catalog does not know"


# Where a card's or a node's readings go in a drawn grid: the grid (the fleet, its models, its
# placement and its replicas) is kept by what it is drawn from, the readings under theirs, and each
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
            ranked = f", {escape(t.replica)} rank {t.group_rank}" if t.group_rank is not None else ""
            group = " group" if t.group_rank is not None else ""
            out.append(
                f'<i class="{hue(t.model_id)}{group}{foreign}{cordoned}" '
                f'title="card {t.card}: {escape(t.model)}{ranked}"></i>'
            )
        else:
            rep, state = escape(t.replica), escape(t.state)
            busy = "" if t.state == "ready" else f" · {state}"
            need = planned.get(t.replica or "")
            rank = (
                f'<span class="rank" title="{rep} runs across nodes: rank {t.group_rank} of its group">'
                f"rank {t.group_rank}</span>"
                if t.group_rank is not None
                else ""
            )
            group = " group" if t.group_rank is not None else ""
            out.append(
                f'<li class="card held {hue(t.model_id)}{group}{foreign}{cordoned}"><span class="idx">card {t.card}</span>'
                f'<a class="holder" href="{links(t.model or "")}">{escape(t.model)}</a>'
                f'<span class="rep" title="{rep}, {state}">{rep}{busy}</span>{rank}{flag}'
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
# What a filled grid's poll stamp is taken under: everything the grid and its readings show.
FILLED_AREAS = ["fleet", "models", "placement", "replicas", "readings"]
# What the readings put into a grid depend on: the readings, and the fleet (which card of which node
# a reading is of; which nodes the reconciler found unreachable).
READINGS_AREAS = ["fleet", "readings"]


def filled_parts(parts: list[Any]) -> list[Any]:
    """A filled grid's key parts: its own, and the clock's 10 s tick."""
    return [*parts, int(time.time() // SEEN_WITHIN_SECONDS)]


def kept_with_readings(
    request: HttpRequest,
    name: str,
    drawing: str,
    html: str,
    node_ids: list[int],
    *,
    compact: bool = False,
) -> SafeString:
    """A drawn grid with these nodes' readings put in. ``drawing`` names the grid drawn (the digest
    of what it was drawn from, ``versions.cache.drawing``, which holds its nodes and whether it is
    compact): the filled grid is kept by it, the readings' versions (``READINGS_AREAS``) and the
    clock's 10 s tick (``filled_parts``), not by the versions of what the grid shows, so a write that
    leaves the drawing as it was (a model's source, a replica's state on another page) finds it filled.
    The readings are kept as data under their versions, so a warm request does neither."""

    def filled() -> SafeString:
        readings = remembered(
            "node-readings",
            READINGS_AREAS,
            [tuple(node_ids), compact],
            lambda: readings_of(node_ids, compact=compact),
            request=request,
        )
        # Not kept by what it is filled from (versions/cache.py, ``drawn_from``): under the sampler the
        # readings differ at nearly every request, and hashing them and the grid cost as much as filling.
        return with_readings(html, readings)

    return remembered(name, READINGS_AREAS, filled_parts([drawing]), filled, request=request)


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


# What ``planned_of`` reads of each card's replica, after ``CARD_ROW`` in ``cards_of``'s rows.
PLANNED_COLUMNS = ("shard__replica__planned_memory__need", "shard__replica__profile_id")


def planned_per_card(replica_names: set[str], *, request: HttpRequest | None = None) -> dict[str, int]:
    """Each replica's planned need on one of its cards, in MiB (``planned_of``): one narrow query."""
    return planned_of(
        Replica.objects.filter(name__in=replica_names).values_list(
            "name", "planned_memory__need", "profile_id"
        ),
        request=request,
    )


def planned_of(replicas: Iterable[tuple], *, request: HttpRequest | None = None) -> dict[str, int]:
    """Each replica's planned need on one of its cards, in MiB, from its rows of (name, recorded need,
    profile): what it recorded when it started, else its profile's as the memory model reckons it
    (``profile_needs``, kept under the models' and the fleet's versions: a replica's state flipped
    reads none of its profile's, model's and class's columns again)."""
    out: dict[str, int] = {}
    reckon: dict[str, int] = {}
    for name, recorded, profile_id in replicas:
        if name is None:
            continue
        if isinstance(recorded, int) and not isinstance(recorded, bool):
            out[name] = recorded // 2**20
        else:
            reckon[name] = profile_id
    if reckon:
        ids = tuple(sorted(set(reckon.values())))
        needs = remembered(
            "profile-needs", ["models", "fleet"], [ids], lambda: profile_needs(ids), request=request
        )
        for name, profile_id in reckon.items():
            need = needs.get(profile_id)
            if need is not None:
                out[name] = need // 2**20
    return out


def profile_needs(profile_ids: tuple[int, ...]) -> dict[int, int | None]:
    """Each profile's need on one card in bytes (None: not known), as the memory model reckons it
    from the profile's, its model's and its class's rows (``need_of_row``): one query."""
    return {
        row[0]: need_of_row(tuple(row))
        for row in Profile.objects.filter(pk__in=profile_ids).values_list(*need_columns())
    }


def grids(
    nodes: list[NodeRow] | list[Node],
    rows: list[tuple],
    *,
    compact: bool = False,
    planned: dict[str, int] | None = None,
    request: HttpRequest | None = None,
) -> list[NodeGrid]:
    """Each node with its cards drawn and the node drawn around them (``row``), marked where the
    readings go (``with_readings``): one query more (the replicas' planned memory, unless given),
    whatever the number of cards."""
    by_id = {n.pk: NodeGrid(n) for n in nodes}
    for row in rows:
        by_id[row[0]].tiles.append(Tile(*row))
    if planned is None:
        planned = (
            {}
            if compact
            else planned_per_card(
                {t.replica for g in by_id.values() for t in g.tiles if t.replica}, request=request
            )
        )
    models, nodes_at = Links("model-detail"), Links("node-detail")
    for g in by_id.values():
        g.html = tiles_html(g.tiles, models, compact=compact, planned=planned)
        g.row = mark_safe(node_html(g, nodes_at(g.node.name), compact=compact))  # noqa: S308 - escaped
    return list(by_id.values())


def rows_html(node_grids: list[NodeGrid]) -> SafeString:
    """The page's nodes, one string: a template loop over 500 nodes cost more than drawing them."""
    return mark_safe("".join(g.row for g in node_grids))  # noqa: S308 - each row is escaped


def legend(node_grids: list[NodeGrid]) -> SafeString:
    """The models holding cards on these nodes, by name: each one's colour, page link and card count,
    and the free cards' colour; empty when none holds any. Drawn here rather than by a template
    loop: a compact page of 500 nodes names hundreds of models."""
    seen: dict[int, list[Any]] = {}
    for g in node_grids:
        for t in g.tiles:
            if t.model_id is not None:
                seen.setdefault(t.model_id, [t.model, hue(t.model_id), 0])[2] += 1
    if not seen:
        return mark_safe("")  # noqa: S308 - empty
    links = Links("model-detail")
    items = "".join(
        f'<li><span class="chip {colour}" aria-hidden="true"></span><a href="{links(name)}">{escape(name)}</a> '
        f'<span class="muted">{n} card{"" if n == 1 else "s"}</span></li>'
        for name, colour, n in sorted(seen.values(), key=lambda v: v[0])
    )
    return mark_safe(  # noqa: S308 - every name is escaped, the colours are ours
        f'<ul class="legend" aria-label="Models holding cards">{items}'
        '<li><span class="chip free" aria-hidden="true"></span>free</li></ul>'
    )
