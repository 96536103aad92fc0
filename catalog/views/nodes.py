"""The nodes: every node's cards as a grid (free, or held by which model), and a node's replicas."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET

from catalog.models import Card, Node, Replica, ServedModel
from catalog.views.common import render_page
from catalog.views.display import hue


@dataclass
class CardTile:
    index: int
    gpu_class: str
    replica: Replica | None
    model: ServedModel | None
    hue: str = ""

    @property
    def free(self) -> bool:
        return self.replica is None


@dataclass
class NodeGrid:
    node: Node
    tiles: list[CardTile] = field(default_factory=list)

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


def _cards() -> QuerySet[Card]:
    return Card.objects.select_related("gpu_class", "shard__replica__profile__model").order_by(
        "node__name", "index"
    )


def grids(nodes: list[Node], cards: QuerySet[Card]) -> list[NodeGrid]:
    """Each node with its cards; two queries in all (the nodes, then every card with its holder)."""
    by_id = {n.pk: NodeGrid(n) for n in nodes}
    for card in cards:
        shard = getattr(card, "shard", None)
        replica = shard.replica if shard is not None else None
        model = replica.profile.model if replica is not None else None
        by_id[card.node_id].tiles.append(
            CardTile(card.index, card.gpu_class.name, replica, model, hue(model.pk) if model else "")
        )
    return list(by_id.values())


def legend(node_grids: list[NodeGrid]) -> list[tuple[ServedModel, str, int]]:
    """The models holding cards on these nodes, with their colour and card count."""
    seen: dict[int, list] = {}
    for g in node_grids:
        for t in g.tiles:
            if t.model is not None:
                seen.setdefault(t.model.pk, [t.model, t.hue, 0])[2] += 1
    return sorted((tuple(v) for v in seen.values()), key=lambda v: v[0].name)


@login_required
@require_GET
def node_list(request: HttpRequest) -> HttpResponse:
    node_grids = grids(list(Node.objects.order_by("name")), _cards())
    return render_page(
        request,
        "catalog/node_list.html",
        {
            "section": "nodes",
            "grids": node_grids,
            "legend": legend(node_grids),
            "cards": sum(len(g.tiles) for g in node_grids),
            "free": sum(g.free for g in node_grids),
        },
    )


@login_required
@require_GET
def node_detail(request: HttpRequest, name: str) -> HttpResponse:
    node = get_object_or_404(Node, name=name)
    grid = grids([node], _cards().filter(node=node))[0]
    held: dict[int, tuple[Replica, list[int]]] = {}
    for t in grid.tiles:
        if t.replica is not None:
            held.setdefault(t.replica.pk, (t.replica, []))[1].append(t.index)
    replicas = []
    for replica, indices in held.values():
        replicas.append((replica, indices))
    replicas.sort(key=lambda pair: pair[0].name)
    return render_page(
        request,
        "catalog/node_detail.html",
        {
            "section": "nodes",
            "node": node,
            "grid": grid,
            "replicas": replicas,
            "legend": legend([grid]),
        },
    )
