"""The specs sent to the node agents: what a replica of a profile runs, and what a live replica runs.

A spec is the body of the agent's ``PUT /v1/replicas/{id}`` (docs/agent-api.md):
the launch policy's launch arguments, then the profile's own; a profile the
policy refuses now is refused here, and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from llmgw_policy import GroupSpec, source_refusal

from audit.models import AuditEntry
from base.errors import DomainError
from catalog.models import Node, Profile, Replica, ServedModel, Shard
from operations.models import RestartStep
from operations.services.placement import replica_placement
from planning import engines


def build_spec(
    *,
    engine: str,
    tp: int,
    args: Iterable[str],
    env: dict[str, str],
    model: ServedModel,
    port: int,
    cards: list[int],
    ready_timeout: float,
    group: GroupSpec | None = None,
) -> dict[str, Any]:
    """The PUT /v1/replicas/{id} body: the launch policy's arguments, then the
    profile's. A profile the launch policy refuses now (it was saved before a
    rule changed) is refused here with the reason, and nothing is sent.

    With ``group``, the spec of one rank of a replica across nodes: the launch policy adds the
    rank flags (each engine's own, agent/llmgw_policy) and the spec names the group as the agent
    checks them (docs/agent-api.md)."""
    eng = engines.engine(engine)
    check_launchable(model=model, engine=engine, args=list(args), env=env)
    spec: dict[str, Any] = {
        "engine": engine,
        "model": model.name,
        "args": engines.launch_args(
            eng, source=model.source, port=port, model=model.name, tp=tp, args=list(args), group=group
        ),
        "env": dict(env),
        "cards": list(cards),
        "port": port,
        "ready_timeout": ready_timeout,
    }
    if group is not None:
        spec["group"] = {"rank": group.rank, "size": group.size, "address": group.address, "port": group.port}
    return spec


def check_launchable(*, model: ServedModel, engine: str, args: list[str], env: dict[str, str]) -> None:
    """The model's source and the profile's arguments and environment pass the
    launch policy as it is now; ``refused_source`` or ``refused_arg`` saying
    why (and what to change) otherwise."""
    bad_source = source_refusal(model.source, settings.LLMGW_MODEL_ROOTS)
    if bad_source is not None:
        raise DomainError("refused_source", f"{model.name} cannot be started: {bad_source.sentence}")
    refusals = engines.refusals(engines.engine(engine), args, env, context_max=model.context_length)
    if refusals:
        raise DomainError(
            "refused_arg",
            f"{model.name} cannot be started as its profile stands: "
            + " ".join(r.sentence for r in refusals)
            + " Change the profile first (it was saved before the launch policy said so).",
        )


def replica_spec(
    profile: Profile,
    *,
    port: int,
    cards: list[int],
    ready_timeout: float = 600,
    group: GroupSpec | None = None,
) -> dict[str, Any]:
    """The spec of a replica of ``profile`` as it is now (of one of its ranks, with ``group``).
    The engine is told its own TP width: a profile keeps the width within a node, which SGLang
    across nodes multiplies by the nodes (``engines.group_widths``)."""
    tp = profile.tp
    if group is not None:
        tp = engines.group_widths(engines.engine(profile.engine), profile.tp, group.size)[0]
    return build_spec(
        engine=profile.engine,
        tp=tp,
        args=profile.args,
        env=profile.env,
        model=profile.model,
        port=port,
        cards=cards,
        ready_timeout=ready_timeout,
        group=group,
    )


def rank_specs(
    profile: Profile,
    ranks: list[tuple[int, Node, list[int]]],
    *,
    port: int,
    rendezvous_port: int,
    ready_timeout: float = 600,
) -> dict[int, dict[str, Any]]:
    """The spec of each rank of a replica of ``profile`` across nodes, by rank: each names rank 0's
    node's agent host and the rendezvous port, and the serving port (which only rank 0 binds; the
    others are headless). ``ranks``: (rank, node, card indices), rank 0 among them."""
    address = next(node.agent_host for rank, node, _ in ranks if rank == 0)
    return {
        rank: replica_spec(
            profile,
            port=port,
            cards=cards,
            ready_timeout=ready_timeout,
            group=GroupSpec(rank=rank, size=len(ranks), address=address, port=rendezvous_port),
        )
        for rank, _, cards in ranks
    }


def running_ranks(replica: Replica, *, ready_timeout: float = 600) -> list[dict[str, Any]]:
    """Each rank of a replica across nodes with the spec it runs, rank 0 first:
    ``[{"rank", "node", "cards", "spec"}]``. The specs are those the restart that started it sent
    (exact), else its profile's when it runs the current revision; a rank whose spec is not known
    has None."""
    by_rank: dict[int, tuple[str, list[int]]] = {}
    for rank, node, index in (
        Shard.objects.filter(replica=replica)
        .order_by("rank", "card__index")
        .values_list("rank", "card__node__name", "card__index")
    ):
        by_rank.setdefault(rank, (node, []))[1].append(index)
    ranks = [(rank, node, cards) for rank, (node, cards) in sorted(by_rank.items())]
    started = (
        RestartStep.objects.filter(new_replica=replica)
        .exclude(ranks=[])
        .order_by("-id")
        .values_list("ranks", flat=True)
        .first()
    )
    specs: dict[int, Any] = {int(r["rank"]): r.get("spec") for r in started or []}
    if not specs and replica.rendezvous_port and ranks:
        profile = Profile.objects.select_related("model").get(pk=replica.profile_id)
        if replica.revision == profile.revision:
            nodes = {n.name: n for n in Node.objects.filter(name__in=[node for _, node, _ in ranks])}
            specs = rank_specs(
                profile,
                [(rank, nodes[node], cards) for rank, node, cards in ranks],
                port=replica.port,
                rendezvous_port=replica.rendezvous_port,
                ready_timeout=ready_timeout,
            )
    return [
        {"rank": rank, "node": node, "cards": cards, "spec": specs.get(rank)} for rank, node, cards in ranks
    ]


def started_spec(replica: Replica) -> dict[str, Any] | None:
    """The spec the restart that started ``replica`` sent its agent (exact); None when no restart
    started it (it was recorded by hand, or by the demo)."""
    return (
        RestartStep.objects.filter(new_replica=replica)
        .exclude(spec=None)
        .order_by("-id")
        .values_list("spec", flat=True)
        .first()
    )


def running_spec(
    replica: Replica,
    *,
    node_cards: list[int] | None = None,
    ready_timeout: float = 600,
    profile: Profile | None = None,
    then_kept: dict[tuple[int, int], dict[str, Any] | None] | None = None,
) -> dict[str, Any] | None:
    """The spec ``replica`` runs, as well as the catalog knows it; None when it does not.

    From the restart step that started it (exact); else from its profile when
    it runs the current revision; else from the profile as it was at the
    replica's revision, which the audit log keeps (every profile save records
    the whole profile). ``profile``: the replica's, with its model, when the caller has it;
    ``then_kept``: the profiles as they were at a revision, read from the log once for a run's
    steps (a restart's old replicas mostly share one).
    """
    started = started_spec(replica)
    if started:
        return started
    if profile is None or profile.pk != replica.profile_id:
        profile = Profile.objects.select_related("model").get(pk=replica.profile_id)
    cards = node_cards if node_cards is not None else replica_placement(replica)[1]
    if replica.revision == profile.revision:
        return replica_spec(profile, port=replica.port, cards=cards, ready_timeout=ready_timeout)
    key = (profile.pk, replica.revision)
    if then_kept is not None and key in then_kept:
        then = then_kept[key]
    else:
        then = _profile_then(profile, replica.revision)
        if then_kept is not None:
            then_kept[key] = then
    if then is None:
        return None
    try:
        return build_spec(
            engine=then["engine"],
            tp=int(then["tp"]),
            args=then.get("args") or [],
            env=then.get("env") or {},
            model=profile.model,
            port=replica.port,
            cards=cards,
            ready_timeout=ready_timeout,
        )
    except (KeyError, TypeError, ValueError, DomainError):
        return None


def _profile_then(profile: Profile, revision: int) -> dict[str, Any] | None:
    """``profile`` as its last save at ``revision`` recorded it in the audit log; None when none
    did. By the snapshot's own fields, whatever the entry's key looks like."""
    entry = (
        AuditEntry.objects.filter(
            object_type="profile",
            after__model=profile.model.name,
            after__name=profile.name,
            after__revision=revision,
        )
        .order_by("-id")
        .first()
    )
    return entry.after if entry is not None and isinstance(entry.after, dict) else None
