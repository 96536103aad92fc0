"""Whether a profile fits its cards, as the planner reckons it: the one check
every write of a profile and every restart runs, so that what is saved and
what is planned never say two things."""

from __future__ import annotations

from catalog.errors import DomainError
from catalog.models import Profile, ServedModel
from catalog.planning import CardMemory, card_memory, context_of, engine
from catalog.planning.units import gib, gib_short
from catalog.selectors import profile_spec, shape_of


def profile_memory(profile: Profile, model: ServedModel | None = None) -> CardMemory | None:
    """What each of ``profile``'s cards would hold; None when it runs on CPUs,
    its engine is unknown, or the shape or context is not known."""
    if profile.gpu_class_id is None:
        return None
    try:
        eng = engine(profile.engine)
    except DomainError:
        return None
    model = model or ServedModel.objects.get(pk=profile.model_id)
    cls = profile.gpu_class
    assert cls is not None  # gpu_class_id was checked
    from catalog.selectors import model_spec

    spec = model_spec(model, [])
    context = context_of(spec, profile_spec(profile), eng)
    return card_memory(
        eng,
        shape_of(model),
        profile.cards,
        context,
        cls.usable_bytes,
        total=cls.memory_mib * 2**20,
        args=list(profile.args) if isinstance(profile.args, list) else [],
        class_name=cls.name,
    )


def refuse_unless_fits(
    profile: Profile, *, doing: str, model: ServedModel | None = None
) -> CardMemory | None:
    """DomainError ``memory`` (400), naming the need and the budget, when the
    profile's cards cannot hold it; the memory otherwise (None: not known)."""
    memory = profile_memory(profile, model)
    if memory is None or memory.fits:
        return memory
    terms = ", ".join(f"{t.name.replace('_', ' ')} {gib(t.bytes)}" for t in memory.terms if t.inside)
    raise DomainError(
        "memory",
        f"{profile.model.name}'s {profile.name} profile does not fit its cards, so it is not {doing}: each of its "
        f"{profile.cards} {profile.gpu_class.name if profile.gpu_class else ''} card(s) would hold {gib(memory.need)} GiB (weights "
        f"{gib(memory.weights)}, KV cache {gib(memory.kv)} for {memory.context} tokens"
        f"{', ' + terms if terms else ''}), more than the {gib_short(memory.budget or 0)} GiB the "
        f"{profile.engine} engine may fill ({memory.budget_how}). Give it more cards or a shorter context "
        "(the model page's resize and context forms say what fits).",
    )
