"""A replica: where it runs, and what its cards were planned to hold beside
what its engine and card reported."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
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
            "log_lengths": LOG_LENGTHS,
            "log_default": LOG_LINES,
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


LOG_LINES = 200  # the tail the replica page shows unless the operator chooses another length
LOG_LENGTHS = (50, 200, 500)  # the lengths offered (the agent answers at most 500 lines)
LOG_POLL = "every 2s"  # while the replica starts or loads, or the operator follows it


def _node_of(replica: Replica) -> Node | None:
    """Where the replica runs, or last ran: its cards' node, else the node its restart put it on."""
    shard = replica.shards.select_related("card__node").first()
    if shard is not None:
        return shard.card.node
    step = RestartStep.objects.filter(new_replica=replica).exclude(node="").order_by("-id").first()
    return Node.objects.filter(name=step.node).first() if step is not None else None


def log_length(request: HttpRequest) -> int:
    """The length the operator chose (``?lines=``), one of ``LOG_LENGTHS``; else the default."""
    raw = request.GET.get("lines", "")
    return int(raw) if raw.isdigit() and int(raw) in LOG_LENGTHS else LOG_LINES


def log_attempt(request: HttpRequest) -> int | None:
    """The earlier start attempt whose kept log the operator chose (``?attempt=``), or None."""
    raw = request.GET.get("attempt", "")
    return int(raw) if raw.isdigit() and 1 <= int(raw) <= 10**9 else None


def read_log(
    replica: Replica, lines: int, attempt: int | None = None, *, with_attempts: bool = False
) -> tuple[Node | None, dict[str, Any], str]:
    """Its node, the agent's answer (id, state, lines; with ``with_attempts``, ``attempts``: the
    start attempts whose logs it keeps) and an error sentence ("" when it answered). The agent is
    given LLMGW_LOG_TIMEOUT_SECONDS a call: a silent one is said not answering, quickly."""
    node = _node_of(replica)
    if node is None:
        return (
            None,
            {},
            f"{replica.name} holds no card and no restart recorded where it ran: no agent to ask.",
        )
    secrets = profile_secrets(replica.profile.engine, replica.profile.env or {})
    client = AgentClient.for_node(node, secrets=secrets, timeout=settings.LLMGW_LOG_TIMEOUT_SECONDS)
    try:
        body = client.log(replica.name, lines=lines, attempt=attempt)
    except AgentCallFailed as exc:
        if exc.code in ("agent_slow", "agent_down"):
            return node, {}, f"Agent not answering: {exc.message}"
        return node, {}, exc.message
    if with_attempts:
        # The log stands without the list: an agent older than the attempts' endpoint answers 404.
        try:
            body["attempts"] = client.attempts(replica.name)["attempts"]
        except AgentCallFailed:
            body["attempts"] = []
    return node, body, ""


@requires(VIEW_REPLICA)
@require_GET
def replica_log(request: HttpRequest, name: str) -> HttpResponse:
    """The tail of the replica's engine log, from its node's agent (which redacts the spec's secrets,
    bounds the size and reads the file at most twice a second), as long as the operator chose; it
    polls itself while the replica starts or loads, or while the operator follows it. Only the agent
    API's fields are shown, cleaned, and the profile's secret values are masked here again, whatever
    the agent sent (``agentclient.answers``); an error is the client's sentence, never the agent's
    body."""
    replica = get_object_or_404(Replica.objects.select_related("profile"), name=name)
    lines = log_length(request)
    attempt = log_attempt(request)
    follow = request.GET.get("follow") == "1" and attempt is None  # an earlier attempt has ended
    node, body, error = read_log(replica, lines, attempt, with_attempts=True)
    state = body.get("state") or replica.state
    attempts = body.get("attempts", [])
    current = next((a["attempt"] for a in attempts if a["current"]), None)
    shown = attempt if attempt is not None and attempt != current else None
    context: dict[str, Any] = {
        "replica": replica,
        "node": node,
        "lines": body.get("lines", [])[-lines:],
        "error": error,
        "state": state,
        "follow": follow,
        "attempts": attempts if len(attempts) > 1 or shown is not None else [],
        "shown": shown,
        "lines_chosen": lines,
        "query": urlencode({"lines": lines, **({"follow": "1"} if follow else {})}),
        "polling": (follow or state in Replica.COMING_UP_STATES) and not error and shown is None,
        "poll": LOG_POLL,
    }
    return render(request, "catalog/replica_detail.html#log", context)


@requires(VIEW_REPLICA)
@require_GET
def replica_log_download(request: HttpRequest, name: str) -> HttpResponse:
    """The same tail as a text file (``?lines=`` as the page), secrets masked as on the page; 504
    with the sentence when its agent does not answer, 404 when there is no node to ask."""
    replica = get_object_or_404(Replica.objects.select_related("profile"), name=name)
    node, body, error = read_log(replica, log_length(request), log_attempt(request))
    if error:  # no node to ask (404), or its agent did not answer (504, a gateway's timeout)
        status = 404 if node is None else 504
        return HttpResponse(error + "\n", status=status, content_type="text/plain; charset=utf-8")
    response = HttpResponse(
        "".join(f"{line}\n" for line in body.get("lines", [])), content_type="text/plain; charset=utf-8"
    )
    attempt = log_attempt(request)
    which = f"-attempt-{attempt}" if attempt is not None else ""
    response["Content-Disposition"] = f'attachment; filename="{replica.name}{which}-log.txt"'
    return response
