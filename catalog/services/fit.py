"""Whether a profile fits its cards, as the planner reckons it: the one check
every write of a profile and every restart runs, so that what is saved and
what is planned never say two things."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from base.errors import DomainError
from catalog.models import Profile, ServedModel
from catalog.selectors import profile_spec, release_of, shape_of
from planning import CardMemory, Shape, card_memory, context_of, engine
from planning.engines import Engine, engine_at, registry, terms_for
from planning.units import gib, gib_short


def planned_with_release(profile: Profile, planned: CardMemory | None) -> dict[str, Any]:
    """What a replica of ``profile`` was planned to hold (the memory answer), with the engine
    release it was planned for (its own, else the fleet's default; "": neither, the engine's current
    terms) and the release range of the memory terms that planned it: the drift per release is read
    from these."""
    if planned is None:
        return {}
    release = release_of(profile)
    try:
        terms_of = terms_for(engine(profile.engine), release).memory.version
    except DomainError:
        terms_of = ""
    return {**planned.as_dict(), "release": release, "terms_of": terms_of}


def profile_memory(
    profile: Profile, model: ServedModel | None = None, *, release: str | None = None
) -> CardMemory | None:
    """What each of ``profile``'s cards would hold, under the memory terms of ``release`` (the
    engine's release; None: the profile's own release, its engine's current terms when it names
    none: a caller for whom the fleet's default matters passes ``release_of(profile)``); None when it runs on CPUs,
    its engine is unknown, or the shape or context is not known."""
    if profile.gpu_class_id is None:
        return None
    try:
        eng = engine_at(profile.engine, profile.engine_version if release is None else release)
    except DomainError:
        return None
    model = model or ServedModel.objects.get(pk=profile.model_id)
    cls = profile.gpu_class
    assert cls is not None  # gpu_class_id was checked
    from catalog.selectors import model_spec

    spec = model_spec(model, [])
    context = context_of(spec, profile_spec(profile), eng)
    args = tuple(profile.args) if isinstance(profile.args, list) else ()
    return _card_memory(
        _Same(eng),
        shape_of(model),
        profile.cards,
        context,
        cls.usable_bytes,
        cls.memory_mib * 2**20,
        args,
        cls.name,
    )


class _Same:
    """An engine as a cache key, by identity: its registry entry holds dicts (so it has no hash),
    and a registry loaded anew gives new entries, so identity is the right sameness."""

    __slots__ = ("engine",)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __hash__(self) -> int:
        return id(self.engine)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.engine is self.engine


@lru_cache(maxsize=4096)
def _card_memory(
    eng: _Same,
    shape: Shape | None,
    cards: int,
    context: int | None,
    usable: int | None,
    total: int,
    args: tuple[str, ...],
    class_name: str,
) -> CardMemory | None:
    """``card_memory``, remembered: it is a pure function of these (frozen) values, and a page of
    50 nodes asks it for some 200 profiles, at about 0.1 ms each, on every load."""
    return card_memory(
        eng.engine, shape, cards, context, usable, total=total, args=list(args), class_name=class_name
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


# Each profile's need on one of its cards, by what it was reckoned from (``need_of_row``): per process,
# bounded (emptied when full: a fleet has a few thousand profiles).
_NEEDS: dict[int, tuple[tuple, int | None]] = {}
_NEEDS_MAX = 8192


def _fields(model: Any) -> list[str]:
    return [f.attname for f in model._meta.concrete_fields]


def need_columns(prefix: str = "") -> list[str]:
    """The columns ``need_of_row`` reads, for a ``values_list`` of profiles (``prefix`` ""), or of
    rows that lead to one (``"profile__"``): every column of the profile, its model and its class."""
    from catalog.models import GPUClass

    return [
        *(f"{prefix}{f}" for f in _fields(Profile)),
        *(f"{prefix}model__{f}" for f in _fields(ServedModel)),
        *(f"{prefix}gpu_class__{f}" for f in _fields(GPUClass)),
    ]


def need_of_row(row: tuple) -> int | None:
    """A profile's need on one card in bytes, as ``profile_memory`` reckons it (None: not known), from
    its row as ``need_columns`` reads it. The memory model is a pure function of the profile's, its
    model's and its class's rows (and the engine registry), so each answer is remembered with every
    column it was reckoned from: a row any column of which changed is reckoned again, one unchanged is
    not, whatever else in the catalog was written. So after a model's edit a page of nodes reckons
    only that model's profiles again, not its hundreds (at 1,000 nodes, 211 profiles on the nodes
    page's first: about 45 ms of memory model and 20 ms of objects built, against one query's rows)."""
    from catalog.models import GPUClass

    if row[0] is None:
        return None
    key = (id(registry()), *row)
    known = _NEEDS.get(row[0])
    if known is not None and known[0] == key:
        return known[1]
    n_profile, n_model = len(_fields(Profile)), len(_fields(ServedModel))
    profile = Profile.from_db("default", _fields(Profile), row[:n_profile])
    model = ServedModel.from_db("default", _fields(ServedModel), row[n_profile : n_profile + n_model])
    cls_row = row[n_profile + n_model :]
    profile.model = model
    profile.gpu_class = (
        GPUClass.from_db("default", _fields(GPUClass), cls_row) if cls_row[0] is not None else None
    )
    memory = profile_memory(profile, model)
    need = memory.need if memory is not None else None
    if len(_NEEDS) >= _NEEDS_MAX:
        _NEEDS.clear()
    _NEEDS[row[0]] = (key, need)
    return need
