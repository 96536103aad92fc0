"""An engine upgrade: a profile's release changed, or the fleet's default release of an engine.

The dry run (``upgrade_what_if``) comes first, on every path (the releases page, ``POST
/api/releases/upgrade/`` with ``dry_run``, ``manage.py engine_upgrade --dry-run``): every profile the
change touches (the one named, or every profile of the engine that runs the fleet's default) is
re-planned under the new release's memory terms (``planning.engines.engine_at``) and floors, with its
KV tokens a card before and after, whether it still fits its cards, and the nodes with its class of
card that cannot run the new release (a floor their agents' facts fail, or the release not installed
there; nodes whose agents never reported are named as not known).

Applying it (``upgrade_apply``) is a change like any other: audited (the profile's save, or the
default's), refused while a restart of a touched model runs, and refused when a touched profile would
no longer fit; the live replicas of each touched profile are then restarted (``restart_start``), one
operation a model, as a resize's are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from audit.services import audit_record, snapshot
from base.actor import Actor
from base.errors import DomainError, not_found
from catalog.models import Node, Profile, ServedModel, live_replicas_q, stale_replicas_q
from catalog.selectors import engine_defaults, node_facts, release_of
from catalog.services.catalog import engine_default_save, profile_save
from catalog.services.fit import profile_memory
from operations.services.busy import refuse_while_restarting
from operations.services.start import restart_start
from planning.engines import engine, engine_at
from planning.releases import floor_of, node_refusal, parse_version
from planning.units import gib


@dataclass
class ProfileUpgrade:
    """One touched profile, before and after."""

    model: str
    profile: str
    release_before: str
    release_after: str
    gpu_class: str
    live_replicas: int
    kv_tokens_before: int | None = None
    kv_tokens_after: int | None = None
    need_before: int | None = None
    need_after: int | None = None
    budget: int | None = None
    fits_after: bool | None = None
    refusal: str = ""  # why it would not run after: its cards' capability, its memory
    nodes_lacking: list[dict[str, str]] = field(default_factory=list)
    nodes_unknown: list[str] = field(default_factory=list)

    @property
    def stops_fitting(self) -> bool:
        return bool(self.refusal)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "profile": self.profile,
            "release_before": self.release_before,
            "release_after": self.release_after,
            "gpu_class": self.gpu_class,
            "live_replicas": self.live_replicas,
            "kv_tokens_before": self.kv_tokens_before,
            "kv_tokens_after": self.kv_tokens_after,
            "need_before": self.need_before,
            "need_after": self.need_after,
            "budget": self.budget,
            "fits_after": self.fits_after,
            "stops_fitting": self.stops_fitting,
            "refusal": self.refusal,
            "nodes_lacking": self.nodes_lacking,
            "nodes_unknown": self.nodes_unknown,
        }


@dataclass
class Upgrade:
    engine: str
    release: str
    scope: str  # "default" or "profile"
    before: str  # the default before (scope default), or the profile's release before
    terms_before: str
    terms_after: str
    profiles: list[ProfileUpgrade]
    note: str = ""
    applied: bool = False
    operations: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "release": self.release,
            "scope": self.scope,
            "before": self.before,
            "memory_terms_before": self.terms_before,
            "memory_terms_after": self.terms_after,
            "profiles": [p.as_dict() for p in self.profiles],
            "stop_fitting": [f"{p.model}/{p.profile}" for p in self.profiles if p.stops_fitting],
            "nodes_lacking": sorted({n["node"] for p in self.profiles for n in p.nodes_lacking}),
            "note": self.note,
            "applied": self.applied,
            "operations": self.operations,
        }


def _touched(engine_name: str, profile: Profile | None) -> list[Profile]:
    if profile is not None:
        return [profile]
    return list(
        Profile.objects.filter(engine=engine_name, engine_version="")
        .select_related("model", "gpu_class")
        .order_by("model__name", "name")
    )


def _profile_named(name: str | None) -> Profile | None:
    """``model/profile``, or None when no profile is named."""
    if not name:
        return None
    model, sep, profile = name.partition("/")
    found = (
        Profile.objects.select_related("model", "gpu_class").filter(model__name=model, name=profile).first()
        if sep
        else None
    )
    if found is None:
        raise not_found(f"No profile {name!r} in the catalog: name it as model/profile.")
    return found


def _plan_one(profile: Profile, before: str, after: str, nodes: list[Node]) -> ProfileUpgrade:
    eng = engine(profile.engine)
    out = ProfileUpgrade(
        model=profile.model.name,
        profile=profile.name,
        release_before=before,
        release_after=after,
        gpu_class=profile.gpu_class.name if profile.gpu_class else "",
        live_replicas=profile.replicas.filter(live_replicas_q()).count(),
    )
    was, will = profile_memory(profile, release=before), profile_memory(profile, release=after)
    if was is not None:
        out.kv_tokens_before, out.need_before = was.kv_tokens, was.need
    if will is not None:
        out.kv_tokens_after, out.need_after, out.budget, out.fits_after = (
            will.kv_tokens,
            will.need,
            will.budget,
            will.fits,
        )
        if not will.fits:
            out.refusal = (
                f"each card would hold {gib(will.need)} GiB, more than the {gib(will.budget or 0)} GiB budget"
            )
    floor = floor_of(eng.floors, after)
    cls = profile.gpu_class
    capability = cls.compute_capability if cls is not None else ""
    for node in nodes:
        if cls is None or not any(c.gpu_class_id == cls.pk for c in node.cards.all()):
            continue
        facts = node_facts(node)
        err = node_refusal(eng.name, after, floor, facts, capability=capability)
        if err is not None:
            if err.code == "capability" and not out.refusal:
                out.refusal = err.message
            out.nodes_lacking.append({"node": node.name, "code": err.code, "reason": err.message})
        elif not facts.known:
            out.nodes_unknown.append(node.name)
    with_class = [
        n for n in nodes if cls is not None and any(c.gpu_class_id == cls.pk for c in n.cards.all())
    ]
    if not out.refusal and with_class and len(out.nodes_lacking) == len(with_class):
        out.refusal = f"no node with {out.gpu_class} cards can run {eng.name} {after}"
    return out


def upgrade_what_if(*, engine_name: str, release: str, profile: str | None = None) -> Upgrade:
    """The dry run of moving ``profile`` (``model/profile``), or the fleet's default of
    ``engine_name``, to ``release``: nothing is saved."""
    eng = engine(engine_name)  # unknown_engine, naming the known ones
    if parse_version(release) is None:
        raise DomainError(
            "invalid",
            f"{release!r} is not a release number: write it as the engine numbers it (0.19.1, b6500).",
        )
    chosen = _profile_named(profile)
    if chosen is not None and chosen.engine != eng.name:
        raise DomainError(
            "invalid", f"{profile} runs the {chosen.engine} engine, not {eng.name}: name its own engine."
        )
    defaults = engine_defaults()
    before = release_of(chosen, defaults) if chosen is not None else defaults.get(eng.name, "")
    if before and parse_version(before) == parse_version(release):
        where = f"{profile}'s release" if chosen is not None else f"the fleet's default of {eng.name}"
        raise DomainError("unchanged", f"{where} is {before} already.")
    nodes = list(Node.objects.prefetch_related("cards").order_by("name"))
    planned = [_plan_one(p, release_of(p, defaults), release, nodes) for p in _touched(eng.name, chosen)]
    terms_before = engine_at(eng.name, before).memory.version
    terms_after = engine_at(eng.name, release).memory.version
    note = ""
    if terms_before == terms_after:
        note = (
            f"The registry keeps one memory model for {eng.name} ({terms_after}): the figures before and after "
            "use the same terms; what the release changes here is its floors and where it is installed."
        )
    return Upgrade(
        engine=eng.name,
        release=release,
        scope="profile" if chosen is not None else "default",
        before=before,
        terms_before=terms_before,
        terms_after=terms_after,
        profiles=planned,
        note=note,
    )


def upgrade_apply(
    *, engine_name: str, release: str, profile: str | None = None, actor: Actor | None = None
) -> Upgrade:
    """Make the change the dry run described: audited, then each touched profile's live replicas
    restarted. Refused (``upgrade_does_not_fit``, nothing saved) when a touched profile would no
    longer fit or run anywhere, and while a restart of a touched model runs."""
    plan = upgrade_what_if(engine_name=engine_name, release=release, profile=profile)
    broken = [p for p in plan.profiles if p.stops_fitting]
    if broken:
        raise DomainError(
            "upgrade_does_not_fit",
            f"{plan.engine} {release} would leave {len(broken)} profile(s) unable to run: "
            + "; ".join(f"{p.model}/{p.profile}: {p.refusal}" for p in broken)
            + ". Nothing was changed: give them a release of their own first, or other cards.",
            status=409,
        )
    cause = f"{plan.engine} {plan.before or 'no release'} → {release}" + (
        f" for {profile}" if plan.scope == "profile" else " (the fleet's default)"
    )
    with transaction.atomic():
        models = sorted({p.model for p in plan.profiles})
        for row in ServedModel.objects.select_for_update().filter(name__in=models).order_by("pk"):
            refuse_while_restarting(row.pk, doing=f"upgrading {plan.engine}")
        if plan.scope == "profile":
            chosen = _profile_named(profile)
            assert chosen is not None
            chosen.engine_version = release
            profile_save(instance=chosen, actor=actor, action="upgrade", message=f"release {cause}")
        else:
            engine_default_save(
                engine=plan.engine,
                version=release,
                actor=actor,
                message=f"the fleet's default release: {cause}",
            )
            # Profiles without a release of their own now run the new default: what they run changed, so
            # their revision goes up and their replicas are stale (audited as each profile's change).
            for touched in _touched(plan.engine, None):
                before = snapshot(touched)
                Profile.objects.filter(pk=touched.pk).update(revision=touched.revision + 1)
                touched.refresh_from_db()
                audit_record(
                    action="upgrade",
                    object_type="profile",
                    object_key=str(touched),
                    object_repr=str(touched),
                    before=before,
                    after=snapshot(touched),
                    actor=actor,
                    message=f"revision {touched.revision}: runs {cause}",
                )
        operations = []
        for model in models:
            stale = list(
                Profile.objects.filter(model__name=model, engine=plan.engine)
                .values_list("replicas__name", flat=True)
                .filter(live_replicas_q("replicas__"), stale_replicas_q("replicas__"))
            )
            if stale:
                op = restart_start(model_name=model, replicas=stale, actor=actor, cause=f"upgrade: {cause}")
                operations.append(op.pk)
    plan.applied, plan.operations = True, operations
    return plan
