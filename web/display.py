"""What the pages draw: the card-memory bar, model colours, before → after.

Plain data built from the planner's answers; the templates only lay it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from base.errors import DomainError
from catalog.models import Profile, ServedModel
from catalog.selectors import model_spec, profile_spec, release_of
from planning import CardMemory, Change, card_memory, context_of, engine
from planning.engines import terms_for
from planning.types import ROOM_NODES_NAMED
from planning.units import gib

HUES = 12  # colours in app.css: .hue-0 … .hue-11


def hue(model_id: int | None) -> str:
    """A model's colour class, the same on every page (by its id)."""
    return f"hue-{(model_id or 0) % HUES}"


TERM_LABELS = {
    "activation": "activation peak",
    "non_torch": "outside PyTorch",
    "comm_buffers": "communication buffers",
    "cuda_graph": "CUDA graphs",
    "runtime": "engine runtime",
    "reserved": "reserved beside the pool",
}


@dataclass(frozen=True)
class Segment:
    kind: str  # weights, kv, overhead (one an engine term), free
    label: str
    bytes: int
    percent: float
    term: str = ""  # the engine term an overhead segment is
    source: str = ""

    @property
    def gib(self) -> str:
        return gib(self.bytes)

    @property
    def labelled(self) -> bool:
        """Wide enough to carry its label inside the bar; the caption names it anyway."""
        return self.percent >= 4 + 1.1 * len(self.label)

    @property
    def width(self) -> str:
        # A dot decimal whatever the locale: it goes into a style attribute.
        return f"{self.percent:.2f}%"


@dataclass(frozen=True)
class MemoryBar:
    """One card's memory as a stacked bar: what it holds against what it may fill.

    The scale is the larger of the need and the budget, so a layout that does
    not fit shows by how much it overflows (the budget is then a marker).
    """

    cards: int
    context: int
    segments: tuple[Segment, ...]
    need: int
    budget: int | None
    fits: bool
    budget_how: str = ""
    kv_tokens: int | None = None
    sequences: float | None = None
    outside: tuple[Segment, ...] = ()  # terms the engine keeps outside its budget

    @classmethod
    def of(cls, memory: CardMemory | Mapping[str, Any] | None) -> MemoryBar | None:
        if memory is None:
            return None
        m = memory.as_dict() if isinstance(memory, CardMemory) else dict(memory)
        budget = m.get("budget")
        scale = max(m["need"], budget or 0) or 1
        terms = m.get("terms") or []
        inside = [t for t in terms if t.get("inside", True)]
        parts: list[tuple[str, str, int, str, str]] = [
            ("weights", "weights", m["weights"], "", ""),
            ("kv", "KV cache", m["kv"], "", ""),
        ]
        if inside:
            parts += [
                (
                    "overhead",
                    TERM_LABELS.get(t["name"], t["name"]),
                    t["bytes"],
                    t["name"],
                    t.get("source", ""),
                )
                for t in inside
            ]
        elif m["overhead"]:
            parts.append(("overhead", "overhead", m["overhead"], "", ""))
        if budget is not None and budget > m["need"]:
            parts.append(("free", "free", budget - m["need"], "", ""))
        segments = tuple(
            Segment(kind, label, n, 100 * n / scale, term, source) for kind, label, n, term, source in parts
        )
        outside = tuple(
            Segment(
                "outside",
                TERM_LABELS.get(t["name"], t["name"]),
                t["bytes"],
                0.0,
                t["name"],
                t.get("source", ""),
            )
            for t in terms
            if not t.get("inside", True)
        )
        fits = budget is None or m["need"] <= budget
        return cls(
            cards=m["cards"],
            context=m["context"],
            segments=segments,
            need=m["need"],
            budget=budget,
            fits=fits,
            budget_how=m.get("budget_how", ""),
            kv_tokens=m.get("kv_tokens"),
            sequences=m.get("sequences"),
            outside=outside,
        )

    @property
    def held(self) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.kind != "free")

    @property
    def need_gib(self) -> str:
        return gib(self.need)

    @property
    def budget_gib(self) -> str:
        return gib(self.budget) if self.budget is not None else ""

    @property
    def budget_at(self) -> str:
        """Where the budget marker goes when the need overflows it."""
        return f"{100 * (self.budget or 0) / max(self.need, 1):.2f}%"

    @property
    def used_percent(self) -> int:
        return round(100 * self.need / self.budget) if self.budget else 0


def shape_facts(model: ServedModel) -> list[tuple[str, str]]:
    """The model's shape in the operators' units (GiB, KiB per token, tokens)."""

    def known(value: object, text: str) -> str:
        return text if value is not None else "not known"

    attention = model.get_attention_display() or "not known"
    if model.sliding_window:
        attention += f", sliding window of {model.sliding_window} tokens on {model.sliding_layers} layers"
    heads = f"{model.attention_heads or '?'} attention, {model.kv_heads or '?'} KV"
    facts = [
        ("Weights", known(model.weight_bytes, f"{gib(model.weight_bytes or 0)} GiB")),
        (
            "KV cache per token",
            known(model.kv_bytes_per_token, f"{(model.kv_bytes_per_token or 0) / 1024:g} KiB"),
        ),
        ("Context", known(model.context_length, f"{model.context_length} tokens")),
        ("Attention", attention),
        ("Heads", heads),
        ("Head size", known(model.head_dim, str(model.head_dim))),
        ("Layers", known(model.layers, str(model.layers))),
        ("Data type", model.dtype or "not known"),
    ]
    if model.expert_bytes:
        facts.append(("Experts", f"{gib(model.expert_bytes)} GiB of the weights"))
    return facts


@dataclass(frozen=True)
class ProfileMemory:
    """A profile on the model page: its cards, its context and its bar, or why there is none."""

    profile: Profile
    context: int | None
    bar: MemoryBar | None
    why_not: str


def served_contexts(model: ServedModel, profiles: list[Profile], *, defaults: Mapping[str, str]) -> list[int]:
    """The contexts the model's profiles serve (the engine's context flag, else the model's own),
    each once, shortest first, each profile by the release it runs (its own, else the fleet's
    default of its engine: ``defaults``, ``catalog.selectors.engine_defaults()`` read once by the
    caller); no query when ``profiles`` are loaded."""
    spec = model_spec(model, profiles)
    known = dict(defaults)
    served: set[int] = set()
    for p in profiles:
        try:
            eng = terms_for(engine(p.engine), release_of(p, known))
        except DomainError:
            continue
        tokens = context_of(spec, profile_spec(p), eng)
        if tokens is not None:
            served.add(tokens)
    return sorted(served)


def cards_said(indices: list[int]) -> str:
    """A replica's cards on a node as cards, not bare numbers: "1 card (#0)", "2 cards (#3, #4)"."""
    n = len(indices)
    return f"{n} card{'s' if n != 1 else ''} ({', '.join(f'#{i}' for i in indices)})"


def profile_memory(
    model: ServedModel, profiles: list[Profile], *, defaults: Mapping[str, str]
) -> list[ProfileMemory]:
    """Each profile's card memory as the planner reckons it, by the memory terms of the release the
    profile runs: its own, else the fleet's default of its engine (``defaults``,
    ``catalog.selectors.engine_defaults()``, read once by the caller). No query: ``profiles`` come
    with their GPU class."""
    spec = model_spec(model, profiles)
    known = dict(defaults)
    out = []
    for p in profiles:
        try:
            eng = terms_for(engine(p.engine), release_of(p, known))
        except DomainError as err:
            out.append(ProfileMemory(p, None, None, err.message))
            continue
        context = context_of(spec, profile_spec(p), eng)
        if p.gpu_class is None:
            out.append(ProfileMemory(p, context, None, "Runs on CPUs: no card memory."))
            continue
        memory = card_memory(
            eng,
            spec.shape,
            p.cards,
            context,
            p.gpu_class.usable_bytes,
            total=p.gpu_class.memory_mib * 2**20,
            args=p.args,
            class_name=p.gpu_class.name,
        )
        why = "" if memory else f"{model.name}'s weights, KV bytes per token or context are not known."
        out.append(ProfileMemory(p, context, MemoryBar.of(memory), why))
    return out


@dataclass(frozen=True)
class Preview:
    """The answer of a dry run, or its refusal, as the preview shows it."""

    kind: str  # "gpus" or "context"
    before: int | None = None
    after: int | None = None
    profile: str = ""
    gpu_class: str | None = None
    args: tuple[str, ...] = ()
    launch: tuple[str, ...] = ()
    bar: MemoryBar | None = None
    places: tuple[Mapping[str, Any], ...] = ()
    beside: tuple[str, ...] = ()  # the first ROOM_NODES_NAMED; the counts say how many in all
    beside_count: int = 0
    in_place_nodes: tuple[str, ...] = ()
    in_place_count: int = 0
    in_place: bool = False
    note: str = ""
    error: str = ""
    code: str = ""
    nodes: int = 1  # the nodes one new replica spans (its ranks)
    per_node: int = 0  # its cards on each
    stages: tuple[Mapping[str, Any], ...] = ()  # a pipeline engine's stages across nodes
    per_card: str = ""

    @property
    def ranked(self) -> bool:
        """Whether some place has several ranks (the table then numbers them)."""
        return any(len(p.get("ranks", ())) > 1 for p in self.places)

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def beside_more(self) -> int:
        return self.beside_count - len(self.beside)

    @property
    def in_place_more(self) -> int:
        return self.in_place_count - len(self.in_place_nodes)

    @property
    def unit(self) -> str:
        return "cards" if self.kind == "gpus" else "tokens"

    @classmethod
    def of_change(cls, change: Change) -> Preview:
        room = change.room
        return cls(
            kind=change.kind,
            before=change.before,
            after=change.after,
            profile=change.profile,
            gpu_class=change.gpu_class,
            args=change.args,
            launch=change.launch,
            bar=MemoryBar.of(change.memory),
            places=tuple(p.as_dict() for p in room.places) if room else (),
            beside=room.beside[:ROOM_NODES_NAMED] if room else (),
            beside_count=len(room.beside) if room else 0,
            in_place_nodes=room.in_place_nodes[:ROOM_NODES_NAMED] if room else (),
            in_place_count=len(room.in_place_nodes) if room else 0,
            in_place=change.in_place,
            note=change.note,
            nodes=change.new_profile.nodes if change.new_profile else 1,
            per_node=change.new_profile.cards // max(change.new_profile.nodes, 1)
            if change.new_profile
            else 0,
            stages=tuple(st.as_dict() for st in change.stages),
            per_card=change.per_card,
        )

    @classmethod
    def of_refusal(cls, kind: str, err: DomainError) -> Preview:
        """The refusal's sentence (the API's ``detail``), with what was worked out before it."""
        c = err.change or {}
        return cls(
            kind=kind,
            before=c.get("before"),
            after=c.get("after"),
            profile=c.get("profile", ""),
            gpu_class=c.get("gpu_class"),
            args=tuple(c.get("args") or ()),
            launch=tuple(c.get("launch") or ()),
            bar=MemoryBar.of(c.get("memory")),
            note=c.get("note", ""),
            error=err.message,
            code=err.code,
        )

    @classmethod
    def of_form_errors(cls, kind: str, errors: Mapping[str, list[str]]) -> Preview:
        sentence = " ".join(str(m) for messages in errors.values() for m in messages)
        return cls(kind=kind, error=sentence, code="invalid")
