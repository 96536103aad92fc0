"""The plain data the planner reads and answers with.

Frozen dataclasses, built by the services from the ORM (or by tests by hand):
nothing here touches a database or a request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from planning.units import gib, gib_short

Attention = Literal["mha", "gqa", "mqa", "mla"]

# How many nodes with room an answer names (the first, by name); the counts say how many in all.
ROOM_NODES_NAMED = 10
ChangeKind = Literal["gpus", "context"]


# What a model's files tell of its size: the one list of these fields, by the names that the
# catalog's model, the planner's Shape, the model-files reader, the API and the cluster's settings
# file all use (tests/catalog/test_shape_fields.py holds each of them to it).
SHAPE_FIELDS = (
    "layers",
    "attention_heads",
    "kv_heads",
    "head_dim",
    "dtype",
    "attention",
    "kv_bytes_per_token",
    "weight_bytes",
    "expert_bytes",
    "sliding_window",
    "sliding_layers",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "replicated_bytes",
    "expert_intermediate_size",
    "expert_format",
    "experts_per_token",
)
# The shape's text fields: the catalog's model keeps an unknown one as "", the planner as None.
TEXT_SHAPE_FIELDS = ("dtype", "attention", "expert_format")


@dataclass(frozen=True)
class Shape:
    """What the model's files say about its size; any figure may be unknown.

    ``kv_bytes_per_token`` is for the whole model as if every layer kept every
    token; ``sliding_layers`` of the ``layers`` keep only the last
    ``sliding_window`` tokens. ``expert_bytes`` is the part of
    ``weight_bytes`` held by mixture-of-experts experts.
    """

    layers: int | None = None
    attention_heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None  # the weights' (the planner counts bytes, not this)
    attention: str | None = None  # one of Attention, or unknown
    kv_bytes_per_token: int | None = None
    weight_bytes: int | None = None
    expert_bytes: int | None = None
    sliding_window: int | None = None
    sliding_layers: int = 0
    hidden_size: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    replicated_bytes: int = 0
    # The routed experts' own width and storage format ("mxfp4"): engines pad
    # some formats' expert tensors (engines.toml expert_padding).
    expert_intermediate_size: int | None = None
    expert_format: str | None = None
    # How many routed experts a token goes through (num_experts_per_tok): the engine's fused-MoE
    # buffers hold that many rows a batch token (engines.toml activation_moe).
    experts_per_token: int | None = None
    context_length: int | None = None


@dataclass(frozen=True)
class ProfileSpec:
    """How a model is served: engine, card class (None: CPU only), layout, arguments."""

    name: str
    engine: str
    gpu_class: str | None
    gpus_per_node: int = 1
    tp: int = 1
    nodes: int = 1
    pp: int = 0
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # The engine release it runs: its own, else the fleet's default of the engine; "" when neither is set.
    engine_version: str = ""

    @property
    def cards(self) -> int:
        """Cards one replica uses: ``max(gpus_per_node, tp, 1) × max(nodes, pp, 1)``."""
        return max(self.gpus_per_node, self.tp, 1) * max(self.nodes, self.pp, 1)

    @property
    def cpu_only(self) -> bool:
        return self.gpu_class is None


@dataclass(frozen=True)
class ModelSpec:
    """A served model as the planner needs it.

    ``declared_in`` is the settings file that declares a declared model, where
    it is changed.
    """

    name: str
    context_length: int | None
    declared: bool
    declared_in: str | None
    shape: Shape | None
    profiles: tuple[ProfileSpec, ...]
    source: str = ""  # the weights the engine is given: repo id or path


@dataclass(frozen=True)
class GPUClassSpec:
    """A kind of card: the memory an engine may fill, its total memory (0:
    unknown), and its compute capability ("9.0")."""

    name: str
    usable_bytes: int
    capability: str
    total_bytes: int = 0


@dataclass(frozen=True)
class NodeRoom:
    """One node's cards of one class.

    ``free`` are held by no replica; ``own`` are held by the model being
    changed (they come free if its replicas are stopped first).
    """

    node: str
    ready: bool
    gpu_class: str
    cards: int
    free: int
    own: int
    # The node's fabric domain (``Node.fabric_domain``): a replica across nodes spans one; "" joins none.
    fabric: str = ""


@dataclass(frozen=True)
class Term:
    """One part of what a card holds beside its weights and KV cache, in
    bytes, with the sentence saying how it was worked out and where the
    engine's figure comes from. ``inside`` is False for a term the engine
    keeps outside its budget (SGLang's activations, outside
    ``--mem-fraction-static``): shown, not added to ``need``."""

    name: str
    bytes: int
    how: str
    source: str
    inside: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bytes": self.bytes,
            "how": self.how,
            "source": self.source,
            "inside": self.inside,
        }


@dataclass(frozen=True)
class CardMemory:
    """What each of ``cards`` cards holds, in bytes, for ``context`` tokens.

    ``budget`` is what the engine may fill on a card: its own budget (e.g.
    vLLM's total x ``--gpu-memory-utilization``) capped by the class's usable
    memory; None when neither is known. ``overhead`` is the sum of ``terms``
    inside the budget. ``kv_tokens`` is how many tokens the cache the engine
    allocates in what is left will hold, ``sequences`` how many full-context
    sequences that is (vLLM's "maximum concurrency"); None when the budget is
    unknown.
    """

    cards: int
    weights: int
    kv: int
    overhead: int
    need: int
    budget: int | None
    context: int
    terms: tuple[Term, ...] = ()
    engine_budget: int | None = None
    class_budget: int | None = None
    budget_how: str = ""
    kv_tokens: int | None = None
    sequences: float | None = None

    @property
    def fits(self) -> bool:
        """True unless the budget is known and the need exceeds it."""
        return self.budget is None or self.need <= self.budget

    @property
    def per_card(self) -> str:
        """E.g. "34.1 GiB on each of 4 cards, of 72 GiB usable on each"."""
        each = "on its 1 card" if self.cards == 1 else f"on each of {self.cards} cards"
        text = f"{gib(self.need)} GiB {each}"
        if self.budget is not None:
            text += f", of {gib_short(self.budget)} GiB usable{' on each' if self.cards != 1 else ''}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "cards": self.cards,
            "weights": self.weights,
            "kv": self.kv,
            "overhead": self.overhead,
            "need": self.need,
            "budget": self.budget,
            "context": self.context,
            "fits": self.fits,
            "terms": [t.as_dict() for t in self.terms],
            **{t.name: t.bytes for t in self.terms},
            "engine_budget": self.engine_budget,
            "class_budget": self.class_budget,
            "budget_how": self.budget_how,
            "kv_tokens": self.kv_tokens,
            "sequences": self.sequences,
        }


@dataclass(frozen=True)
class Room:
    """Where the new replicas fit.

    ``in_place`` is True when some replica fits nowhere beside the running
    ones and stopping it first was asked for. ``beside`` lists the nodes with
    the cards free now; ``in_place_nodes`` those with them free once the
    model's own replicas stop; ``places`` where the restart will put each
    replica, in its order (empty when the restart was not simulated).
    """

    in_place: bool
    beside: tuple[str, ...] = ()
    in_place_nodes: tuple[str, ...] = ()
    places: tuple[Any, ...] = ()  # placement.Placement, one a restarted replica, in restart order

    def as_dict(self) -> dict[str, Any]:
        """The answer names at most ``ROOM_NODES_NAMED`` nodes of each kind, with how many there
        are: at 1,000 nodes a list of every one would be most of the answer, and no one reads it."""
        return {
            "in_place": self.in_place,
            "beside": list(self.beside[:ROOM_NODES_NAMED]),
            "beside_count": len(self.beside),
            "in_place_nodes": list(self.in_place_nodes[:ROOM_NODES_NAMED]),
            "in_place_count": len(self.in_place_nodes),
            "places": [p.as_dict() for p in self.places],
        }


@dataclass(frozen=True)
class Change:
    """A planned change: the answer of a resize (``kind="gpus"``, ``before`` and
    ``after`` are card counts) or of a context change (``kind="context"``, they
    are tokens; ``before`` is None when the context was not known).

    ``args`` are the profile's arguments after the change, ``launch`` the
    whole command line the engine will get (the launcher's own flags and the
    TP width included; ``{port}`` is each replica's own), ``new_profile`` the
    profile to save, ``note`` what could not be checked. ``restarted`` and
    ``operation`` (the restart operation's id) are filled in by the service
    that restarts the replicas.
    """

    model: str
    profile: str
    engine: str
    gpu_class: str | None
    before: int | None
    after: int
    kind: ChangeKind = "gpus"
    args: tuple[str, ...] = ()
    launch: tuple[str, ...] = ()
    per_card: str = ""
    memory: CardMemory | None = None
    room: Room | None = None
    restarted: int = 0
    in_place: bool = False
    note: str = ""
    new_profile: ProfileSpec | None = None
    operation: int | None = None
    # A replica across nodes of a pipeline engine: each stage's memory (``stages.Stage``), first
    # first; ``memory`` is then the fullest stage's. Empty on one node.
    stages: tuple[Any, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The API's keys (docs/design.md, "Resize"), plus ``kind``, ``memory`` and ``room``."""
        return {
            "model": self.model,
            "profile": self.profile,
            "engine": self.engine,
            "gpu_class": self.gpu_class,
            "kind": self.kind,
            "before": self.before,
            "after": self.after,
            "args": list(self.args),
            "launch": list(self.launch),
            "per_card": self.per_card,
            "restarted": self.restarted,
            "in_place": self.in_place,
            "note": self.note,
            "memory": self.memory.as_dict() if self.memory else None,
            "room": self.room.as_dict() if self.room else None,
            "operation": self.operation,
            "nodes": self.new_profile.nodes if self.new_profile else None,
            "stages": [s.as_dict() for s in self.stages],
        }
