"""The specs sent to the node agents: what a replica of a profile runs, and what a live replica runs.

A spec is the body of the agent's ``PUT /v1/replicas/{id}`` (docs/agent-api.md):
the launch policy's launch arguments, then the profile's own; a profile the
policy refuses now is refused here, and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from llmgw_policy import source_refusal

from audit.models import AuditEntry
from base.errors import DomainError
from catalog.models import Profile, Replica, ServedModel
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
) -> dict[str, Any]:
    """The PUT /v1/replicas/{id} body: the launch policy's arguments, then the
    profile's. A profile the launch policy refuses now (it was saved before a
    rule changed) is refused here with the reason, and nothing is sent."""
    eng = engines.engine(engine)
    check_launchable(model=model, engine=engine, args=list(args), env=env)
    return {
        "engine": engine,
        "model": model.name,
        "args": engines.launch_args(
            eng, source=model.source, port=port, model=model.name, tp=tp, args=list(args)
        ),
        "env": dict(env),
        "cards": list(cards),
        "port": port,
        "ready_timeout": ready_timeout,
    }


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
    profile: Profile, *, port: int, cards: list[int], ready_timeout: float = 600
) -> dict[str, Any]:
    """The spec of a replica of ``profile`` as it is now."""
    return build_spec(
        engine=profile.engine,
        tp=profile.tp,
        args=profile.args,
        env=profile.env,
        model=profile.model,
        port=port,
        cards=cards,
        ready_timeout=ready_timeout,
    )


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
    replica: Replica, *, node_cards: list[int] | None = None, ready_timeout: float = 600
) -> dict[str, Any] | None:
    """The spec ``replica`` runs, as well as the catalog knows it; None when it does not.

    From the restart step that started it (exact); else from its profile when
    it runs the current revision; else from the profile as it was at the
    replica's revision, which the audit log keeps (every profile save records
    the whole profile).
    """
    started = started_spec(replica)
    if started:
        return started
    profile = Profile.objects.select_related("model").get(pk=replica.profile_id)
    cards = node_cards if node_cards is not None else replica_placement(replica)[1]
    if replica.revision == profile.revision:
        return replica_spec(profile, port=replica.port, cards=cards, ready_timeout=ready_timeout)
    # By the snapshot's own fields, whatever the entry's key looks like.
    entry = (
        AuditEntry.objects.filter(
            object_type="profile",
            after__model=profile.model.name,
            after__name=profile.name,
            after__revision=replica.revision,
        )
        .order_by("-id")
        .first()
    )
    if entry is None or not isinstance(entry.after, dict):
        return None
    then = entry.after
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
