"""Every write to the catalog: validate, save inside a transaction, audit there.

Each public function is ``<entity>_<action>(*, ..., actor=None)``; the actor
defaults to the one the entry point set (middleware, command, worker).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models.deletion import ProtectedError
from django.utils import timezone
from llmgw_policy import Refusal, source_refusal

from audit.services import audit_record, changed_fields, snapshot
from base.actor import Actor
from base.errors import DomainError, conflict, declared
from catalog.agent_address import validate_agent_url
from catalog.models import Card, EngineDefault, GPUClass, Node, Profile, Replica, ServedModel, Shard
from operations.services.busy import refuse_while_restarting
from planning.types import SHAPE_FIELDS, TEXT_SHAPE_FIELDS

M = TypeVar("M", bound=models.Model)

# A change to any of these is a change to what runs: replicas on the old revision are stale.
SERVING_FIELDS = (
    "engine",
    "engine_version",
    "gpu_class",
    "gpus_per_node",
    "tp",
    "nodes",
    "pp",
    "args",
    "env",
)


def validation_sentence(exc: ValidationError) -> str:
    if hasattr(exc, "message_dict"):
        parts = []
        for field, messages in exc.message_dict.items():
            label = "" if field == "__all__" else f"{field}: "
            parts.append(label + " ".join(messages))
        return "; ".join(parts)
    return " ".join(exc.messages)


def declared_refusal(model: ServedModel) -> DomainError:
    return declared(model.name, model.declared_in or settings.LLMGW_CLUSTER_SETTINGS)


def ensure_not_declared(model: ServedModel | None) -> None:
    if model is not None and model.declared:
        raise declared_refusal(model)


# The audit log names what changed in the operators' words: a "model", not a "servedmodel".
_OPERATOR_WORDS = {"servedmodel": "model"}


def _object_type(instance: models.Model) -> str:
    name = instance._meta.model_name or type(instance).__name__.lower()
    return _OPERATOR_WORDS.get(name, name)


def _object_key(instance: models.Model) -> str:
    """The name when it alone identifies the object (a node, a model), else its
    full string ("llama/h100" for a profile, "gpu-1#3" for a card)."""
    try:
        field = instance._meta.get_field("name")
    except FieldDoesNotExist:
        return str(instance)
    if isinstance(field, models.Field) and field.unique:
        return str(field.value_from_object(instance))
    return str(instance)


def _save(
    instance: M,
    *,
    actor: Actor | None,
    message: str = "",
    action: str | None = None,
    before_save: Callable[[M, dict[str, Any] | None], None] | None = None,
) -> M:
    """Validate and save ``instance``, writing one audit entry; nothing is saved on failure."""
    model_cls = type(instance)
    creating = instance.pk is None
    try:
        with transaction.atomic():
            before = None
            if not creating:
                current = model_cls._default_manager.select_for_update().get(pk=instance.pk)
                before = snapshot(current)
            if before_save is not None:
                before_save(instance, before)
            instance.full_clean()
            instance.save()
            after = snapshot(instance)
            if not creating and not changed_fields(before, after):
                return instance  # nothing changed: nothing to record
            audit_record(
                action=action or ("create" if creating else "update"),
                object_type=_object_type(instance),
                object_key=_object_key(instance),
                object_repr=str(instance),
                before=before,
                after=after,
                message=message
                or ("" if creating else "changed " + ", ".join(changed_fields(before, after))),
                actor=actor,
            )
    except ValidationError as exc:
        raise DomainError("invalid", validation_sentence(exc)) from exc
    except IntegrityError as exc:
        raise DomainError("integrity", f"The database refused the change: {exc}".strip()) from exc
    return instance


def _delete(instance: models.Model, *, actor: Actor | None, message: str = "") -> None:
    try:
        with transaction.atomic():
            before = snapshot(instance)
            key = _object_key(instance)
            repr_ = str(instance)
            instance.delete()
            audit_record(
                action="delete",
                object_type=_object_type(instance),
                object_key=key,
                object_repr=repr_,
                before=before,
                after=None,
                message=message,
                actor=actor,
            )
    except ProtectedError as exc:
        users = sorted({str(o) for o in exc.protected_objects})[:5]
        raise conflict(
            "in_use", f"{instance} is still used by {', '.join(users)}: remove or move those first."
        ) from exc


# GPU classes, nodes, cards ---------------------------------------------------------------


def gpu_class_save(*, instance: GPUClass, actor: Actor | None = None) -> GPUClass:
    return _save(instance, actor=actor)


def gpu_class_delete(*, instance: GPUClass, actor: Actor | None = None) -> None:
    _delete(instance, actor=actor)


def node_state_refusal(name: str) -> str:
    """Where a node's state is changed instead of an edit."""
    where = name or "NAME"
    return (
        f"A node's state is changed by cordon, uncordon and drain only, not by an edit: POST "
        f"/api/nodes/{where}/cordon/ (no new placements), /uncordon/ (placements again) or /drain/ (its "
        f"replicas moved off, then cordoned), the node page's buttons, or manage.py cordon, uncordon or "
        f"drain {where}. Leave state out of the change."
    )


def node_save(*, instance: Node, actor: Actor | None = None) -> Node:
    """Save a node; its agent URL is checked (``catalog.agent_address``: its host resolved, inside
    the fleet's networks), its token by the model (printable ASCII, 32 characters or more), and the
    audit log keeps only the token's fingerprint. Its state is cordon's, uncordon's and drain's
    (``operations.services.drain``): a new node is ready, and a save never changes it."""

    def guard(obj: Node, before: dict[str, Any] | None) -> None:
        was = before["state"] if before is not None else Node.State.READY
        if obj.state != was:
            raise DomainError("state_by_operation", node_state_refusal(obj.name))
        validate_agent_url(obj.agent_url)

    return _save(instance, actor=actor, before_save=guard)


def node_token_save(
    *, instance: Node, new_token: str, grace_seconds: float, actor: Actor | None = None
) -> Node:
    """Save the agent token a rotation gave the node's agent (``operations.services.agent_token``),
    audited by fingerprint: called only once the agent has answered with it."""
    instance.agent_token = new_token
    return _save(
        instance,
        actor=actor,
        action="rotate_token",
        message=f"agent token rotated; the agent accepts the old one for {grace_seconds:g} s",
    )


def _named(kind: str, names: list[str], shown: int = 5) -> str:
    """ "replica a", "replicas a, b and 3 more": the names in the way, a few of them."""
    listed = ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
    return f"{kind}{'s' if len(names) > 1 else ''} {listed}"


def node_delete(*, instance: Node, actor: Actor | None = None) -> None:
    holders = sorted(set(Shard.objects.filter(card__node=instance).values_list("replica__name", flat=True)))
    if holders:
        raise conflict(
            "in_use",
            f"Node {instance.name} has cards held by {_named('replica', holders)}: drain the node (its page, "
            f"the API or `manage.py drain {instance.name}`) to move them, then remove it.",
        )
    _delete(instance, actor=actor)


def card_save(*, instance: Card, actor: Actor | None = None) -> Card:
    return _save(instance, actor=actor)


def card_delete(*, instance: Card, actor: Actor | None = None) -> None:
    holder = Shard.objects.filter(card=instance).values_list("replica__name", flat=True).first()
    if holder is not None:
        raise conflict(
            "in_use",
            f"Card {instance} is held by replica {holder}: move {holder} off it (its page, the API or "
            f"`manage.py move_replica {holder}`) or cordon the card to keep new replicas off it, then remove it.",
        )
    _delete(instance, actor=actor)


# Models and profiles ----------------------------------------------------------------------


def model_save(
    *, instance: ServedModel, actor: Actor | None = None, from_settings: bool = False
) -> ServedModel:
    """Save a model; a declared one only from the cluster settings sync."""

    def guard(obj: ServedModel, before: dict[str, Any] | None) -> None:
        validate_model_source(obj.source)
        if from_settings:
            return
        if before is not None and before.get("declared"):
            raise declared_refusal(obj)
        if obj.declared:
            raise DomainError(
                "declared", "Only the cluster settings sync may mark a model declared.", status=409
            )

    return _save(instance, actor=actor, before_save=guard)


def model_delete(*, instance: ServedModel, actor: Actor | None = None, from_settings: bool = False) -> None:
    if not from_settings:
        ensure_not_declared(instance)
    running = list(
        Replica.objects.filter(profile__model=instance)
        .exclude(state=Replica.State.STOPPED)
        .order_by("name")
        .values_list("name", flat=True)
    )
    if running:
        raise conflict(
            "in_use",
            f"Model {instance.name} has {_named('replica', running)} not stopped: stop them first, then remove it.",
        )
    # Its stopped replicas go with it, each recorded, all or nothing.
    with transaction.atomic():
        for replica in Replica.objects.filter(profile__model=instance, state=Replica.State.STOPPED):
            replica_delete(instance=replica, actor=actor)
        _delete(instance, actor=actor)


def validate_profile_spec(
    profile: Profile, *, before: dict[str, Any] | None = None, context_from_operation: bool = False
) -> None:
    """Engine known, arguments a list of strings, env a mapping of strings,
    and the launch policy's allowlist passed (``agent/llmgw_policy``).

    The engine's context flag is the context operation's: it may stay as it
    was, but only the context operation (or the cluster settings file, for a
    declared model) may write it, and never above the model's length.
    """
    from planning import engines  # the registry is data; loaded once

    engine = engines.engine(profile.engine)
    if not isinstance(profile.args, list) or not all(isinstance(a, str) for a in profile.args):
        raise DomainError("invalid", 'args must be a list of strings, e.g. ["--max-num-seqs", "64"].')
    if not isinstance(profile.env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in profile.env.items()
    ):
        raise DomainError(
            "invalid", 'env must be a mapping of strings to strings, e.g. {"HF_HUB_OFFLINE": "1"}.'
        )
    _check_release(engine, profile)
    model = profile.model
    refusals = engines.refusals(engine, profile.args, profile.env, context_max=model.context_length)
    if not context_from_operation and not refusals:
        now = engines.context_arg(engine, profile.args)
        was = None
        if before is not None and before.get("engine") == profile.engine:
            was = engines.context_arg(engine, before.get("args") or [])
        if now is not None and now != was:
            flag = engine.context_flags[0]
            refusals = [
                Refusal(
                    "refused_arg",
                    flag,
                    f"{flag} is refused for {engine.name}: the launcher sets it, not a profile (the context "
                    "length is set by the context operation: the model page's context form, "
                    f"POST /api/models/{model.name}/context/ or manage.py context {model.name} TOKENS).",
                )
            ]
    if refusals:
        raise DomainError("refused_arg", " ".join(r.sentence for r in refusals))


def _check_release(engine: Any, profile: Profile) -> None:
    """The profile's release reads as a release number, and its cards meet the release's compute
    capability floor (``capability``, with the figures). The floors a node's facts must meet (driver,
    CUDA, architecture, the release installed) are placement's: a save does not choose nodes."""
    from catalog.selectors import release_of
    from planning.releases import floor_of, parse_version

    if profile.engine_version and parse_version(profile.engine_version) is None:
        raise DomainError(
            "invalid",
            f"engine_version {profile.engine_version!r} is not a release number: write it as the engine "
            "numbers it (0.19.1, 1.0.0rc4, b6500), or leave it empty for the fleet's default.",
        )
    release = release_of(profile)
    floor = floor_of(engine.floors, release)
    cls = profile.gpu_class
    if floor is None or not floor.capability or cls is None:
        return
    have, need = parse_version(cls.compute_capability), parse_version(floor.capability)
    if have is not None and need is not None and have < need:
        what = f"{engine.name} {release}" if release else f"The {engine.name} engine"
        raise DomainError(
            "capability",
            f"{what} needs cards of compute capability {floor.capability} or newer; {cls.name} cards are "
            f"{cls.compute_capability}.",
        )


def engine_default_save(
    *, engine: str, version: str, actor: Actor | None = None, message: str = ""
) -> EngineDefault:
    """Set the fleet's default release of ``engine`` (audited). What it changes for the profiles that
    run the default is the upgrade's to say and do (``operations.services.upgrade``)."""
    from planning import engines
    from planning.releases import parse_version

    engines.engine(engine)  # unknown_engine, naming the known ones
    if parse_version(version) is None:
        raise DomainError(
            "invalid",
            f"{version!r} is not a release number: write it as the engine numbers it (0.19.1, b6500).",
        )
    instance = EngineDefault.objects.filter(engine=engine).first() or EngineDefault(engine=engine)
    instance.version = version
    return _save(instance, actor=actor, message=message)


def validate_model_source(source: str) -> None:
    """A Hugging Face repo id (org/name, optionally @revision) or an absolute
    path under ``LLMGW_MODEL_ROOTS``; ``refused_source`` otherwise."""
    refusal = source_refusal(source, settings.LLMGW_MODEL_ROOTS)
    if refusal is not None:
        raise DomainError("refused_source", refusal.sentence)


def profile_save(
    *,
    instance: Profile,
    actor: Actor | None = None,
    from_settings: bool = False,
    message: str = "",
    action: str | None = None,
    context_from_operation: bool = False,
) -> Profile:
    """Save a profile; its revision goes up whenever what it runs changes.

    ``context_from_operation``: the context operation (or the demo's seed)
    writes the engine's context flag; no other path may change it."""

    def guard(obj: Profile, before: dict[str, Any] | None) -> None:
        model = ServedModel.objects.select_for_update().get(pk=obj.model_id)
        if not from_settings:
            ensure_not_declared(model)
        validate_profile_spec(
            obj, before=before, context_from_operation=context_from_operation or from_settings
        )
        # What is saved is what the planner approves: a profile its cards
        # cannot hold is refused on every path (admin, API, settings file).
        from catalog.services.fit import refuse_unless_fits

        refuse_unless_fits(obj, doing="saved", model=model)
        if before is not None:
            proposed = snapshot(obj)
            if any(before.get(f) != proposed.get(f) for f in SERVING_FIELDS):
                # Under the model's row lock: a restart that starts after this sees the new revision whole.
                refuse_while_restarting(model.pk, doing=f"changing what its {obj.name} profile runs")
                obj.revision = int(before["revision"]) + 1

    return _save(instance, actor=actor, before_save=guard, message=message, action=action)


def profile_delete(*, instance: Profile, actor: Actor | None = None, from_settings: bool = False) -> None:
    if not from_settings:
        ensure_not_declared(instance.model)
    _delete(instance, actor=actor)


# Replicas and their cards -----------------------------------------------------------------


def replica_save(
    *, instance: Replica, actor: Actor | None = None, message: str = "", action: str | None = None
) -> Replica:
    if instance.pk and Replica.objects.filter(pk=instance.pk).exclude(state=instance.state).exists():
        instance.state_changed_at = timezone.now()  # the reconciler's fence (reconcile.py)
    return _save(instance, actor=actor, message=message, action=action)


def replica_delete(*, instance: Replica, actor: Actor | None = None) -> None:
    _delete(instance, actor=actor)


def shard_save(*, instance: Shard, actor: Actor | None = None) -> Shard:
    def guard(obj: Shard, before: dict[str, Any] | None) -> None:
        other = (
            Shard.objects.filter(card_id=obj.card_id)
            .exclude(pk=obj.pk)
            .values_list("replica__name", flat=True)
            .first()
        )
        if other is not None:
            raise conflict(
                "card_busy",
                f"Card {obj.card} is held by replica {other}: choose a free card, or stop or move {other} first.",
            )

    return _save(instance, actor=actor, before_save=guard)


def shard_delete(*, instance: Shard, actor: Actor | None = None) -> None:
    _delete(instance, actor=actor)


def set_shape(instance: ServedModel, shape: Mapping[str, Any]) -> None:
    """Set those of ``instance``'s shape fields (``SHAPE_FIELDS``) and context length that
    ``shape`` names, unsaved. An unknown text (None) is kept as "" (``selectors.shape_of``
    reads it back as None)."""
    for field in (*SHAPE_FIELDS, "context_length"):
        if field in shape:
            value = shape[field]
            setattr(instance, field, "" if value is None and field in TEXT_SHAPE_FIELDS else value)


def model_import(
    *, name: str, source: str, shape: dict[str, Any], actor: Actor | None = None, message: str = ""
) -> ServedModel:
    """Create a model from the shape its files give, or refresh an existing one's shape."""
    validate_model_source(source)
    with transaction.atomic():
        instance = ServedModel.objects.select_for_update().filter(name=name).first()
        if instance is None:
            instance = ServedModel(name=name)
        else:
            ensure_not_declared(instance)
        instance.source = source
        set_shape(instance, shape)
        return _save(instance, actor=actor, message=message or f"shape imported from {source}")
