"""Resize a model to N cards, or change its context: plan, save, audit, (restart).

The rules are the planner's (planning); this module reads the catalog
for it, holds the model's row while the change is saved, and writes the
profile through profile_save so the audit entry lands in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.db import OperationalError, connection, transaction

from base.actor import Actor
from base.errors import DomainError, conflict, not_found
from catalog import selectors
from catalog.models import Profile, ServedModel, stale_replicas_q
from catalog.services.catalog import profile_save
from operations.selectors import rooms_and_fleet
from operations.services.busy import refuse_while_restarting
from operations.services.start import restart_start
from planning import Change, plan_context, plan_resize
from telemetry.selectors import foreign_held_card_ids
from versions.cache import remembered, usable


def _busy(name: str) -> DomainError:
    return conflict("busy", f"Another change to {name} is being saved right now: look at it, then try again.")


def _is_lock_conflict(exc: OperationalError) -> bool:
    """Whether the database refused only because another transaction holds the lock.

    Any other failure (a lost connection, a broken query) is not "busy" and is not hidden as one.
    """
    if getattr(exc.__cause__, "sqlstate", None) == "55P03":  # PostgreSQL's lock_not_available (NOWAIT)
        return True
    # SQLite's writer lock still held when its busy timeout ran out.
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


def _lock_model(name: str) -> ServedModel:
    """The model's row, locked for this transaction (OperationalError if another change holds it)."""
    qs = ServedModel.objects.filter(name=name)
    if connection.vendor == "postgresql":
        qs = qs.select_for_update(nowait=True)
    # SQLite takes the write lock when the transaction begins (IMMEDIATE): a
    # second writer waits for the first, then sees its change (unchanged).
    model = qs.first()
    if model is None:
        raise not_found(f"No model {name!r} in the catalog.")
    return model


def _plan(planner: Callable[..., Change], model: ServedModel, profile: str | None, **kw: Any) -> Change:
    profiles = list(model.profiles.select_related("gpu_class").order_by("name"))
    chosen = next((p for p in profiles if p.name == profile), None) if profile else None
    if chosen is None and not profile:
        on_cards = [p for p in profiles if p.gpu_class_id]
        chosen = on_cards[0] if len(on_cards) == 1 else None
    running = selectors.live_replicas(chosen).count() if chosen else 0
    rooms, fleet = rooms_and_fleet(chosen)
    return planner(
        model=selectors.model_spec(model, profiles, defaults=selectors.engine_defaults()),
        profile=profile,
        classes=selectors.gpu_class_specs(),
        nodes=rooms,
        running=running,
        fleet=fleet,
        **kw,
    )


def _apply(model: ServedModel, change: Change, *, action: str, message: str, actor: Actor | None) -> Change:
    new = change.new_profile
    assert new is not None  # the planner always proposes the profile it approved
    profile = Profile.objects.select_related("gpu_class").get(model=model, name=change.profile)
    profile.gpus_per_node, profile.tp, profile.nodes, profile.pp = (
        new.gpus_per_node,
        new.tp,
        new.nodes,
        new.pp,
    )
    profile.args, profile.env = list(new.args), dict(new.env)
    profile = profile_save(
        instance=profile,
        action=action,
        message=message,
        actor=actor,
        context_from_operation=action == "set_context",
    )
    stale = list(selectors.live_replicas(profile).filter(stale_replicas_q()).values_list("name", flat=True))
    if not stale:
        return change
    # In the same transaction: the restart is recorded with the change, and its
    # task is enqueued only once both are committed. The restart takes the
    # replicas as the planner played them through: rolling where it found room
    # beside, in place only for the replicas it found none for (None: each
    # step chooses as the simulation did).
    places = change.room.places if change.room else ()
    if places and all(p.in_place for p in places):
        mode: bool | None = True
    elif any(p.in_place for p in places) or (change.in_place and not places):
        mode = None if places else True
    else:
        mode = False
    unit = "cards" if change.kind == "gpus" else "tokens"
    what = "resize" if change.kind == "gpus" else "context"
    cause = f"{what} of {change.profile}: {change.before} → {change.after} {unit}"
    operation = restart_start(model_name=model.name, replicas=stale, in_place=mode, actor=actor, cause=cause)
    return replace(change, restarted=len(stale), operation=operation.pk)


def _refuse_while_restarting(model: ServedModel, action: str) -> None:
    """A change while a restart of the model runs would be overtaken by it: refused before it is
    planned (a dry run says so too, whatever the plan would find), and again under the model's lock."""
    doing = "resizing it" if action == "resize" else "changing its context"
    refuse_while_restarting(model.pk, doing=doing)


def _dry_run(
    name: str, planner: Callable[..., Change], *, profile: str | None, action: str, **kw: Any
) -> Change:
    model = ServedModel.objects.filter(name=name).first()
    if model is None:
        raise not_found(f"No model {name!r} in the catalog.")
    _refuse_while_restarting(model, action)
    return _plan(planner, model, profile, **kw)


def _dry_run_kept(
    name: str, planner: Callable[..., Change], *, profile: str | None, action: str, **kw: Any
) -> Change:
    """The dry run's answer, or its refusal, kept under the catalog's and the operations' versions
    (versions/cache.py): it is a pure function of them, of what was asked, and of the cards a
    foreign process holds (read here, one query: the only telemetry it reads, and the only part the
    clock changes, as readings age past LLMGW_TELEMETRY_STALE_SECONDS)."""

    if not usable():
        return _dry_run(name, planner, profile=profile, action=action, **kw)

    def outcome() -> tuple[Change | None, tuple | None]:
        try:
            return _dry_run(name, planner, profile=profile, action=action, **kw), None
        except DomainError as err:
            return None, (err.code, err.message, err.status, err.change)

    asked = (planner.__name__, name, profile, action, sorted(kw.items()), sorted(foreign_held_card_ids()))
    change, refusal = remembered(
        "dry-run", ["structure", "placement", "replicas", "operations"], asked, outcome
    )
    if refusal is not None:
        code, message, status, worked_out = refusal
        raise DomainError(code, message, status=status, change=worked_out)
    assert change is not None
    return change


def _change_model(
    name: str,
    planner: Callable[..., Change],
    *,
    profile: str | None,
    dry_run: bool,
    action: str,
    describe: Callable[[Change], str],
    actor: Actor | None,
    **kw: Any,
) -> Change:
    if dry_run:
        return _dry_run_kept(name, planner, profile=profile, action=action, **kw)
    try:
        with transaction.atomic():
            model = _lock_model(name)
            _refuse_while_restarting(model, action)
            change = _plan(planner, model, profile, **kw)
            return _apply(model, change, action=action, message=describe(change), actor=actor)
    except OperationalError as exc:
        if _is_lock_conflict(exc):
            raise _busy(name) from exc
        raise


def model_resize(
    *,
    name: str,
    gpus: int,
    profile: str | None = None,
    in_place: bool = False,
    dry_run: bool = False,
    actor: Actor | None = None,
    nodes: int | None = None,
) -> Change:
    """Spread ``name``'s profile over ``gpus`` cards: of one node, or across ``nodes`` nodes (None:
    one node when one has the cards, else the fewest that divide them evenly).

    Every check of docs/design.md's "Resize" runs, in its order; a refusal raises
    DomainError and saves nothing. ``dry_run`` runs them all and saves nothing.
    """
    return _change_model(
        name,
        plan_resize,
        profile=profile,
        dry_run=dry_run,
        action="resize",
        actor=actor,
        gpus=gpus,
        node_count=nodes,
        in_place=in_place,
        describe=lambda c: (
            f"{c.model}/{c.profile}: {c.before} → {c.after} cards"
            f"{_across(c)} ({c.per_card or 'memory not checked'})"
        ),
    )


def _across(change: Change) -> str:
    nodes = change.new_profile.nodes if change.new_profile else 1
    return f" across {nodes} nodes" if nodes > 1 else ""


def model_set_context(
    *,
    name: str,
    tokens: int,
    profile: str | None = None,
    in_place: bool = False,
    dry_run: bool = False,
    actor: Actor | None = None,
) -> Change:
    """Set the engine's context flag of ``name``'s profile to ``tokens``, with the memory and room checks."""
    return _change_model(
        name,
        plan_context,
        profile=profile,
        dry_run=dry_run,
        action="set_context",
        actor=actor,
        tokens=tokens,
        in_place=in_place,
        describe=lambda c: f"{c.model}/{c.profile}: context {c.before} → {c.after} tokens",
    )
