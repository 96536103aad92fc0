"""A replica: where it runs, and what its cards were planned to hold beside
what its engine and card reported."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from agentclient.client import AgentCallFailed, AgentClient
from base.rules import requires
from base.secrets import profile_secrets
from base.views import VIEW_REPLICA, render_page
from catalog.models import Node, Replica
from catalog.services.fit import profile_memory
from operations.models import RestartStep
from operations.services.drain import move_targets
from planning.measured import compare, drift
from planning.units import gib
from web.display import hue


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


def missing_said(measured: dict[str, Any] | None) -> str:
    """The start-up figures the engine should have printed and did not, in words; "" when none."""
    words = {
        "weights": "weights",
        "kv_cache": "KV cache",
        "kv_tokens": "cache tokens",
        "sequences": "concurrency",
        "cuda_graph": "CUDA graphs",
    }
    return ", ".join(words.get(m, m) for m in (measured or {}).get("missing") or [])


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
    engines = drift(
        ((r.profile.engine, str(r.planned_memory.get("release") or "")), r.planned_memory, r.measured_memory)
        for r in others
    )
    measured = replica.measured_memory or {}
    ranks = [
        {
            "rank": "a worker that did not say its rank" if rank == "-1" else rank,
            **{
                key: _fmt(figures.get(key), key)
                for key in ("weights", "kv_cache", "kv_tokens", "activation", "cuda_graph")
            },
        }
        for rank, figures in sorted((measured.get("ranks") or {}).items(), key=lambda item: int(item[0]))
    ]
    placement: dict[str, list[int]] = {}
    for s in replica.shards.select_related("card__node").order_by("card__node__name", "card__index"):
        placement.setdefault(s.card.node.name, []).append(s.card.index)
    return render_page(
        request,
        "catalog/replica_detail.html",
        {
            "section": "models",
            "replica": replica,
            "move_targets": move_targets(replica),
            "model": replica.profile.model,
            "hue": hue(replica.profile.model_id),
            "placement": list(placement.items()),
            "rows": rows,
            "planned_from": planned_from,
            "measured": bool(replica.measured_memory),
            "ranks": ranks,
            "missing": missing_said(measured),
            "release": str((replica.planned_memory or {}).get("release") or ""),
            "terms_of": str((replica.planned_memory or {}).get("terms_of") or ""),
            "drift": [
                {
                    "engine": e,
                    "release": release or "its default release",
                    "mean": f"{mean:+.1%}",
                    "count": count,
                }
                for (e, release), (mean, count) in engines.items()
            ],
        },
    )


LOG_LINES = 200  # the tail the replica page shows
LOG_POLL = "every 2s"  # while the replica starts or loads


def _node_of(replica: Replica) -> Node | None:
    """Where the replica runs, or last ran: its cards' node, else the node its restart put it on."""
    shard = replica.shards.select_related("card__node").first()
    if shard is not None:
        return shard.card.node
    step = RestartStep.objects.filter(new_replica=replica).exclude(node="").order_by("-id").first()
    return Node.objects.filter(name=step.node).first() if step is not None else None


@requires(VIEW_REPLICA)
@require_GET
def replica_log(request: HttpRequest, name: str) -> HttpResponse:
    """The tail of the replica's engine log, from its node's agent (which redacts the spec's secrets,
    bounds the size and reads the file at most twice a second); it polls itself while the replica
    starts or loads. Only the agent API's fields are shown, cleaned, and the profile's secret values
    are masked here again, whatever the agent sent (``agentclient.answers``); an error is the
    client's sentence, never the agent's body."""
    replica = get_object_or_404(Replica.objects.select_related("profile"), name=name)
    node = _node_of(replica)
    context: dict[str, Any] = {
        "replica": replica,
        "node": node,
        "lines": [],
        "error": "",
        "state": replica.state,
    }
    if node is None:
        context["error"] = (
            f"{replica.name} holds no card and no restart recorded where it ran: no agent to ask."
        )
    else:
        secrets = profile_secrets(replica.profile.engine, replica.profile.env or {})
        try:
            body = AgentClient.for_node(node, secrets=secrets).log(replica.name, lines=LOG_LINES)
        except AgentCallFailed as exc:
            context["error"] = exc.message
        else:
            context["lines"] = body["lines"][-LOG_LINES:]
            context["state"] = body["state"] or replica.state
    context["polling"] = context["state"] in Replica.COMING_UP_STATES and not context["error"]
    context["poll"] = LOG_POLL
    return render(request, "catalog/replica_detail.html#log", context)
